"""The profiling batch each release and GPU give vLLM's profile, and V0's dummy prompts, as its code builds them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packaging.version import Version

from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.profile_batch import profiling_batch, v0_decoder_dummy
from harness.units import GiB

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name).read_text())


QWEN3_VL = _config("Qwen--Qwen3-VL-30B-A3B-Instruct.json")
QWEN25_VL = _config("Qwen--Qwen2.5-VL-7B-Instruct.json")
QWEN25_VL_72B = _config("Qwen--Qwen2.5-VL-72B-Instruct.json")


def test_v1_profiles_the_large_gpu_defaults_but_not_on_an_a100() -> None:
    # vllm/engine/arg_utils.py `_set_default_args_v1`: an API server on a GPU of 70 GiB or more gets
    # 8,192 batched tokens and 1,024 sequences; from 0.9.0 a device named "a100" keeps 2,048 and 256.
    h100, a100 = int(79.22 * GiB), int(79.25 * GiB)
    assert profiling_batch(Version("0.10.1.1"), False, h100, 16384, None, None, "H100-80GB")[:2] == (8192, 1024)
    assert profiling_batch(Version("0.10.1.1"), False, a100, 16384, None, None, "A100-80GB")[:2] == (2048, 256)
    # 0.8.5 has no A100 check: the 80 GB card gets the large defaults too.
    assert profiling_batch(Version("0.8.5"), False, a100, 16384, None, None, "A100-80GB")[:2] == (8192, 1024)
    # V1 samples one row per request and makes no more requests than tokens: 512 tokens, 512 rows. The scheduler
    # still takes its 1,024 sequences, which size the second runner's per-request state.
    small_batch = profiling_batch(Version("0.11.0"), False, h100, 131072, 512, None, "H100-80GB")
    assert (small_batch[0], small_batch[1], small_batch[3]) == (512, 512, 1024)
    # From 0.28 a card of 160 GiB or more gets 16,384 tokens and 1,024 sequences; a B200 (178.4 GiB) before 0.28
    # keeps the ≥ 70 GiB defaults.
    b200 = int(178.36 * GiB)
    assert profiling_batch(Version("0.28.0"), False, b200, 32768, None, None, "B200")[:2] == (16384, 1024)
    assert profiling_batch(Version("0.27.1"), False, b200, 32768, None, None, "B200")[:2] == (8192, 1024)
    # Before 0.8.5 V1 chose by the device's name: an H100 or H200 batched 8,192 tokens, any other GPU 2,048, and
    # 0.8.0-0.8.3 gave every GPU 1,024 sequences, 0.8.4 only those two (256 for the rest), 0.7 256 to all.
    assert profiling_batch(Version("0.8.2"), False, h100, 128000, None, None, "H100-80GB")[:2] == (8192, 1024)
    assert profiling_batch(Version("0.8.3"), False, a100, 4096, None, None, "A100-80GB")[:2] == (2048, 1024)
    assert profiling_batch(Version("0.8.4"), False, a100, 4096, None, None, "A100-80GB")[:2] == (2048, 256)
    assert profiling_batch(Version("0.8.4"), False, h100, 4096, None, None, "H200")[:2] == (8192, 1024)
    assert profiling_batch(Version("0.7.2"), False, h100, 4096, None, None, "H100-80GB")[:2] == (8192, 256)
    # A 24 GiB card is below 70 GiB whatever its name.
    assert profiling_batch(Version("0.10.1.1"), False, int(22.18 * GiB), 8192, None, None, "A10-24GB")[:2] \
        == (2048, 256)


def test_a_gb10_profiles_the_small_defaults_whatever_its_memory() -> None:
    # 121.69 GiB, but NVML reports no memory for the integrated GB10, so `get_batch_defaults` falls to 0 bytes
    # (2,048 tokens, 256 sequences; NVIDIA's 0.13.0 build logs "Chunked prefill is enabled with
    # max_num_batched_tokens=2048" on one), and from 0.33, which reads CUDA's total instead, compute
    # capability 12.1 keeps it there. A stated batch still wins; its rows stay 256.
    gb10 = int(121.69 * GiB)
    for release in ("0.11.0", "0.13.0", "0.19.1", "0.28.0", "0.33.0"):
        assert profiling_batch(Version(release), False, gb10, 32768, None, None, "GB10")[:2] == (2048, 256)
    assert profiling_batch(Version("0.13.0"), False, gb10, 32768, None, None, "DGX Spark")[:2] == (2048, 256)
    assert profiling_batch(Version("0.13.0"), False, gb10, 32768, 8192, None, "GB10")[:2] == (8192, 256)


def test_v0_profiles_max_model_len_tokens_without_chunked_prefill() -> None:
    # V0 without chunked prefill: max_num_batched_tokens = max(max_model_len, 2048), max_num_seqs 256;
    # above 32,768 tokens of context V0 turns chunked prefill on with 512-token batches.
    assert profiling_batch(Version("0.7.3"), True, 8 * GiB, 32768, None, None)[:2] == (32768, 256)
    assert profiling_batch(Version("0.7.3"), True, 8 * GiB, 1024, None, None)[:2] == (2048, 256)
    assert profiling_batch(Version("0.7.3"), True, 8 * GiB, 131072, None, None)[:2] == (512, 256)


def test_v0_batches_at_least_5120_tokens_for_a_multimodal_model_and_never_chunks_it() -> None:
    # SchedulerConfig: max(max_model_len, 2048), then at least 5,120 for a multimodal model; arg_utils never turns
    # chunked prefill on for one in V0, so 131,072 tokens of context profile 131,072 tokens, not 512.
    assert profiling_batch(Version("0.8.3"), True, 40 * GiB, 4096, None, 2, multimodal=True)[:2] == (5120, 2)
    assert profiling_batch(Version("0.8.3"), True, 40 * GiB, 131072, None, None, multimodal=True)[:2] \
        == (131072, 256)
    assert profiling_batch(Version("0.8.3"), False, 40 * GiB, 4096, None, 2, multimodal=True)[:2] == (2048, 2)


def test_v0_keeps_an_mla_models_long_prefill_whole_from_0_8_2() -> None:
    # arg_utils: "Chunked prefill not supported for Multimodal or MLA in V0", so 163,840 tokens of context batch
    # max(163,840, 2,048) tokens; 0.7.2 sized its 512-token chunked batch before turning chunking off for MLA.
    assert profiling_batch(Version("0.8.5"), True, 80 * GiB, 163840, None, None, mla=True)[:2] == (163840, 256)
    assert profiling_batch(Version("0.7.2"), True, 80 * GiB, 163840, None, None, mla=True)[:2] == (512, 256)
    assert profiling_batch(Version("0.8.5"), True, 80 * GiB, 163840, None, None)[:2] == (512, 256)


def test_v0_keeps_a_dummy_prompt_whole_from_0_8_3_so_the_decoder_runs_over_every_placeholder() -> None:
    # vllm-project/vllm#16570: Qwen2.5-VL-72B on V0 0.8.3, --max-model-len 4096 --max-num-seqs 2, 5,120 batched
    # tokens. The largest image, 3,584² (the 12,845,056-pixel bound), is 256² = 65,536 patches, 16,384 tokens;
    # 4,096 − 16,384 leaves no room for a frame, so the video keeps one, padded to a temporal pair: 16,384 more.
    # 5,120 // 32,768 = 0 sequences, so one, with the whole batch as its share; its 32,768 placeholders are kept,
    # and so are its 131,072 patches' float32 pixels: 131,072 × 3 × 2 × 14² × 4 B = 616,562,688 B, held twice
    # through the forward pass (the keyword arguments and the model's concatenated copy).
    found = v0_decoder_dummy(QWEN25_VL_72B, Version("0.8.3"), max_model_len=4096, batched_tokens=5120,
                             max_num_seqs=2, hidden=8192, tensor_parallel_size=4)
    assert found is not None
    assert (found.sequences, found.tokens, found.pixel_bytes) == (1, 32_768, 616_562_688)
    assert found.held_bytes == 2 * 616_562_688
    # The encoder runs on the image, then on the video, 65,536 patches each. Beside both pixel copies it holds the
    # pass's bf16 cast of them (65,536 × 1,176 × 2 B = 154,140,672 B) and the text's input embeddings (32,768 ×
    # 8,192 × 2 B = 536,870,912 B); at TP 4 its widest moment is 0.8.3's qkv all-gather: this rank's qkv (960),
    # the gathered whole and its reordered copy (2 × 3,840), the block's input and norm (2,560): 11,200 values a
    # patch, 65,536 × 11,200 × 2 B = 1,468,006,400 B. The two passes are alike: 3,392,143,360 B.
    assert found.encoder_peak_bytes == 2 * 616_562_688 + 154_140_672 + 536_870_912 + 1_468_006_400 == 3_392_143_360
    # 0.8.2 profiled such a prompt as text of its share: one sequence still, of 5,120 tokens, and no pixels.
    earlier = v0_decoder_dummy(QWEN25_VL_72B, Version("0.8.2"), max_model_len=4096, batched_tokens=5120,
                               max_num_seqs=2, hidden=8192)
    assert earlier is not None and (earlier.sequences, earlier.tokens, earlier.pixel_bytes) == (1, 5120, 0)
    assert earlier.encoder_peak_bytes == 0  # no pixels, no encoder pass


def test_v0_cuts_its_sequences_to_the_prompts_whose_placeholders_fit_the_batch() -> None:
    # Images only (video limit 0), 40,960 tokens: one 16,384-token image a prompt, 40,960 // 16,384 = 2 sequences
    # of 20,480 tokens each, which hold their image: 40,960 tokens, 2 sampled rows. From 0.10 the pixels are in the
    # model's dtype: 2 × 65,536 patches × 3 × 2 × 14² × 2 B = 308,281,344 B.
    found = v0_decoder_dummy(QWEN25_VL, Version("0.10.1"), max_model_len=40960, batched_tokens=40960,
                             max_num_seqs=256, hidden=3584, launch=EncoderLaunch(video_limit=0))
    assert found is not None and (found.sequences, found.tokens, found.pixel_bytes) == (2, 40_960, 308_281_344)
    # One encoder call over both images' 131,072 patches, with nothing to cast: the two pixel copies, the input
    # embeddings (40,960 × 3,584 × 2 B = 293,601,280 B) and on one GPU the MLP's moment, gate_up, its activated half
    # and down_proj's output (3 × 3,420 + 1,280) beside the block's input and norm (2,560): 14,100 values a patch,
    # 131,072 × 14,100 × 2 B = 3,696,230,400 B.
    assert found.encoder_peak_bytes == 2 * 308_281_344 + 293_601_280 + 3_696_230_400 == 4_606_394_368


def test_v0_dummy_prompts_are_priced_for_qwen2_vl_families_in_the_releases_read() -> None:
    def dummy(config: dict[str, Any], release: str, launch: EncoderLaunch | None = None) -> object:
        return v0_decoder_dummy(config, Version(release), max_model_len=4096, batched_tokens=5120, max_num_seqs=2,
                                hidden=3584, launch=launch)

    assert dummy(QWEN25_VL, "0.9.2") is None  # 0.9's model runner was not read
    assert dummy(QWEN25_VL, "0.6.5") is None
    assert dummy(QWEN3_VL, "0.10.2") is None
    assert dummy(_config("llava-hf--llava-1.5-7b-hf.json"), "0.8.3") is None
    assert dummy(QWEN25_VL, "0.8.3", EncoderLaunch(image_limit=0, video_limit=0)) is None
