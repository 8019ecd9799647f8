"""One request's room in a predicted cache, against the calculator's error band."""

from __future__ import annotations

from harness.predict.budget import CapacityPrediction
from harness.predict.cache_margin import cache_margin
from harness.units import GiB


def _capacity(num_blocks: int, blocks_per_request: int, bytes_per_block: int) -> CapacityPrediction:
    return CapacityPrediction(
        available_kv_bytes=num_blocks * bytes_per_block, available_kv_source="test", block_size=16,
        bytes_per_block=bytes_per_block, kv_cache_groups=1, num_blocks=num_blocks, kv_cache_tokens=num_blocks * 16,
        max_model_len=blocks_per_request * 16, blocks_per_request=blocks_per_request,
        max_concurrency=num_blocks / blocks_per_request, whole_sequences_at_max_model_len=0, engine_version="0.8.3",
        assumptions=[])


def test_a_fit_inside_the_error_band_is_at_risk_and_one_beyond_it_fits() -> None:
    # Qwen2.5-VL-72B over four GPUs: 80 layers × 2 KV heads a rank × 128 dims × K,V × 2 B × 16 tokens = 1,310,720 B
    # a block. 381 blocks against one 4,096-token request's 256 leave 125 × 1,310,720 = 163,840,000 B (156.25 MiB).
    # 37.41 GiB usable is int(37.41 × 2^30) = 40,168,681,635 B; a band of 2% of it, 803,373,632 B: the fit is inside.
    usable = int(37.41 * GiB)
    margin = cache_margin(_capacity(381, 256, 1_310_720), usable, 0.02)
    assert (margin.margin_bytes, margin.band_bytes, margin.at_risk) == (163_840_000, 803_373_632, True)
    # 1,000 blocks leave 744 × 1,310,720 = 975,175,680 B, beyond the band: it fits.
    assert not cache_margin(_capacity(1000, 256, 1_310_720), usable, 0.02).at_risk
    # 200 blocks are 56 short of one request: "does not fit" stays the call, not "at risk".
    short = cache_margin(_capacity(200, 256, 1_310_720), usable, 0.02)
    assert short.margin_bytes == -56 * 1_310_720 and not short.at_risk
