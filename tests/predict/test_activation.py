"""The profiling run's activation parts: each figure worked out from the layer code it cites."""

from __future__ import annotations

from pathlib import Path

from harness.predict.activation import ActivationParts, forward_peak_bytes, sampler_peak_bytes
from harness.predict.model_shape import load_model_shape
from harness.predict.parameter_count import model_size
from harness.predict.sampler_peak import FLASHINFER_BYTES_PER_LOGIT

CORPUS = Path(__file__).parents[1] / "fixtures" / "field"


def _config(name: str) -> dict:
    return load_model_shape(str(CORPUS / "configs" / name)).config


def test_dense_forward_peak_holds_gate_up_beside_the_activated_half() -> None:
    # Llama-3.1-8B, TP=1, V0's 20,000-token profile: residual, MLP input and down output (3 × 4,096) beside
    # gate_up (2 × 14,336) and the activated half (14,336): 55,296 values × 2 B × 20,000 = 2,211,840,000 B
    # = 2.06 GiB. The 0.6 log printed peak_torch_memory 17.06 GiB less 14.99 GiB of weights = 2.07 GiB.
    size = model_size(_config("meta-llama--Llama-3.1-8B-Instruct.json"))
    assert forward_peak_bytes(size, 20_000, 1) == 2_211_840_000
    # TP=2 halves the MLP and adds the all-reduce output: (4 × 4,096 + 3 × 7,168) × 2 B × 2,048 = 155,189,248.
    assert forward_peak_bytes(size, 2048, 2) == 155_189_248


def test_moe_forward_peak_counts_the_fused_moe_caches_per_routed_copy() -> None:
    # Qwen3-235B-A22B, TP=4, 8,192 tokens: 3 × 4,096 + 4,096 (all-reduce) = 16,384 values per token, and
    # per routed copy (8) fused_experts_impl's cache13 of max(2 × 1,536 / 4, 4,096) = 4,096 and cache2 of 384:
    # 8 × 4,480 = 35,840. (16,384 + 35,840) × 8,192 × 2 B = 855,638,016 B.
    size = model_size(_config("Qwen--Qwen3-235B-A22B-FP8.json"))
    assert forward_peak_bytes(size, 8192, 4) == 855_638_016


def test_a_model_with_dense_and_moe_layers_peaks_at_the_wider() -> None:
    # DeepSeek-V2-Lite, TP=2, 2,048 tokens. Dense first layer: 4 × 2,048 + 3 × 10,944 / 2 = 24,608 values.
    # MoE layers: 4 × 2,048 + 2,048 (shared experts' output) = 10,240, plus 6 routed copies of
    # max(2 × 1,408 / 2, 2,048) + 704 = 2,752, i.e. 16,512: 26,752 values, wider than the dense layer.
    # 26,752 × 2,048 × 2 B = 109,576,192 B.
    size = model_size(_config("deepseek-ai--DeepSeek-V2-Lite.json"))
    assert forward_peak_bytes(size, 2048, 2) == 109_576_192


def test_sampler_peak_is_rows_times_the_whole_vocabulary() -> None:
    # Qwen3-235B on H100s (V1 ≥ 70 GiB: 1,024 rows), FlashInfer at 14 B per logit: 1,024 × 151,936 × 14 =
    # 2,178,154,496 B, beside the 8,192 tokens' hidden states (8,192 × 4,096 × 2 B = 67,108,864).
    size = model_size(_config("Qwen--Qwen3-235B-A22B-FP8.json"))
    assert sampler_peak_bytes(size, 8192, 1024, FLASHINFER_BYTES_PER_LOGIT) == 2_245_263_360


def test_the_peak_is_the_encoder_or_what_is_held_beside_the_wider_of_pass_and_sampler() -> None:
    # 5 B of encoder moment; 2 B held beside a 3 B pass or a sampler of 1 B of hidden states and 10 logits.
    parts = ActivationParts(encoder=None, encoder_peak_bytes=5, held_bytes=2, forward_bytes=3, hidden_states_bytes=1,
                            logits=10)
    # At 0.1 B a logit the sampler is 1 + 1 = 2 B: 2 + max(3, 2) = 5, the encoder's moment, which ties.
    assert parts.peak_bytes(0.1) == 5
    # At 1 B a logit the sampler is 1 + 10 = 11 B: 2 + 11 = 13, above the encoder.
    assert parts.peak_bytes(1.0) == 13
    # A stage before the last samples nothing: max(5, 2 + 3) = 5.
    assert parts.unsampled_bytes() == 5
