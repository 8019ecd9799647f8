"""The encoder's part of V1's profiling run for Qwen VL checkpoints: the dummy batch vLLM builds, checked against
the budgets real start-up logs print, and the bytes it holds, worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.encoder_profile import EncoderProfile, encoder_profile

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name).read_text())


QWEN3_VL = _config("Qwen--Qwen3-VL-30B-A3B-Instruct.json")
QWEN25_VL = _config("Qwen--Qwen2.5-VL-7B-Instruct.json")


def profile(config: dict[str, Any], release: str, max_model_len: int, batched_tokens: int = 8192,
            launch: EncoderLaunch | None = None, tensor_parallel_size: int = 1) -> EncoderProfile | None:
    return encoder_profile(config, Version(release), max_model_len=max_model_len, batched_tokens=batched_tokens,
                           max_num_seqs=256, tensor_parallel_size=tensor_parallel_size, dtype_bytes=2, launch=launch)


@pytest.mark.parametrize(("release", "max_model_len", "batched_tokens"), [
    ("0.11.0", 65536, 2048),  # sipeed/sipeed_wiki NanoKVM_Pro/cua.md: 4 × RTX 3090, Qwen3-VL-30B-A3B
    ("0.11.0", 32768, 8192),  # vllm-project/vllm#27992: Qwen3-VL-8B at --max-model-len 32768
])
def test_qwen3_vl_profiles_one_video_in_a_budget_of_153600_tokens_as_its_logs_print(release, max_model_len,
                                                                                     batched_tokens) -> None:
    # Both logs: "Encoder cache will be initialized with a budget of 153600 tokens, and profiled with 1 video items
    # of the maximum feature size." The video shrinks to 32 × 32 frames under the 25,165,824-pixel whole-video
    # bound, so 24,576 frames (the cap) make 12,288 temporal patches of 2 × 2 = 49,152 patches, 12,288 tokens,
    # counted 12.5 times for their timestamps: 153,600.
    found = profile(QWEN3_VL, release, max_model_len, batched_tokens)
    assert found is not None
    assert (found.modality, found.items, found.budget_tokens) == ("video", 1, 153_600)
    assert (found.patches_per_item, found.tokens_per_item) == (49_152, 12_288)


def test_qwen3_vl_holds_its_padded_outputs_and_pixels_through_the_decoder_run() -> None:
    # 0.12.0 scatters the 12,288 output rows into zeros of the item's 153,600 rows, each 2,048 × (1 + 3 deepstack
    # levels) = 8,192 wide in bf16: 153,600 × 8,192 × 2 = 2,516,582,400 B, beside the originals (12,288 × 8,192 × 2
    # = 201,326,592 B) and the pixels, cast to the model's dtype from 0.10 (49,152 patches × 3 channels × 2 frames
    # × 16² = 1,536 values × 2 B = 150,994,944 B): 2,868,903,936 B in all.
    found = profile(QWEN3_VL, "0.12.0", 65536)
    assert found is not None and found.held_bytes == 2_868_903_936
    # 0.11 pads to the encoder budget instead, here the same 153,600 rows.
    eleven = profile(QWEN3_VL, "0.11.2", 65536)
    assert eleven is not None and eleven.held_bytes == 2_868_903_936


def test_from_0_13_qwen3_vl_profiles_its_largest_image_and_pads_nothing() -> None:
    # 0.13 drops the timestamps' 12.5 (the video counts its 12,288 tokens) and the padding, so the 4,096² image's
    # 16,384 tokens win: 65,536 patches, outputs 16,384 × 8,192 × 2 = 268,435,456 B and bf16 pixels 65,536 × 1,536
    # × 2 = 201,326,592 B, 469,762,048 B held through the decoder's run.
    found = profile(QWEN3_VL, "0.13.0", 65536)
    assert found is not None
    assert (found.modality, found.budget_tokens, found.held_bytes) == ("image", 16_384, 469_762_048)
    # From 0.15 a video is two frames at the video bound halved for the pair, 12,582,912 pixels factorised as
    # 96 × 128 units of 32: 3,072 × 4,096, 192 × 256 = 49,152 patches.
    videos = profile(QWEN3_VL, "0.17.0", 65536, launch=EncoderLaunch(image_limit=0))
    assert videos is not None and (videos.modality, videos.patches_per_item) == ("video", 49_152)
    # From 0.29 the second GPU runner profiles MoE models too, and frees the pixels before the decoder's run.
    second = profile(QWEN3_VL, "0.29.0", 65536)
    assert second is not None and second.held_bytes == 268_435_456


def test_the_second_runner_did_not_profile_the_encoder_in_0_25_and_0_26() -> None:
    # Dense models moved to the second GPU runner in 0.25, whose profile_run ran no encoder until 0.27; from then
    # on it holds the outputs alone (Qwen2.5-VL-7B at 32,768 tokens: 32,768 × 3,584 × 2 = 234,881,024 B).
    assert profile(QWEN25_VL, "0.25.0", 32768) is None and profile(QWEN25_VL, "0.26.0", 32768) is None
    assert profile(QWEN25_VL, "0.24.0", 32768) is not None  # 0.24 named no VL model for it
    later = profile(QWEN25_VL, "0.27.0", 32768)
    assert later is not None and later.held_bytes == 234_881_024


def test_qwen25_vl_before_0_11_profiles_a_small_dummy_in_a_video_sized_budget() -> None:
    # vllm-project/vllm#15264 (0.8.1, Qwen2.5-VL-7B at its 128,000-token default) logs "a budget of 98304 tokens,
    # and profiled with 1 video items": 128,000 less one 16,384-token image leaves 111,616 tokens for 12 frames (6
    # temporal patches × 16,384). The dummy itself is built for the 8,192 batched tokens, too few for a second
    # frame: one 3,584² frame, 256 × 256 = 65,536 patches, 16,384 tokens. Held: 16,384 × 3,584 × 2 =
    # 117,440,512 B of outputs and 65,536 × 3 × 2 × 14² × 4 = 308,281,344 B of pixels, nothing padded.
    found = profile(QWEN25_VL, "0.8.2", 128000)
    assert found is not None
    assert (found.modality, found.items, found.budget_tokens) == ("video", 1, 98_304)
    assert (found.patches_per_item, found.held_bytes) == (65_536, 117_440_512 + 308_281_344)
    # The encoder call holds those float32 pixels, the model's concatenated copy of them (308,281,344 B again) and
    # their bf16 cast (`.type(self.visual.dtype)`, 154,140,672 B) beside its widest moment, 0.12.0's on one GPU
    # (14,100 values a patch: 65,536 × 14,100 × 2 B = 1,848,115,200 B).
    assert found.encoder_peak_bytes == 2 * 308_281_344 + 154_140_672 + 1_848_115_200


def test_qwen25_vl_in_0_9_profiles_one_largest_image_in_the_models_dtype() -> None:
    # tsailiming/openshift-ai-bootstrap's 0.9.0.1 start of Qwen2.5-VL-7B at --max-model-len 2048 (2,048 batched
    # tokens) logs "a budget of 16384 tokens, and profiled with 1 image items": at 2,048 tokens no video frame pair
    # outweighs the 3,584² image, 256² = 65,536 patches merged 2 × 2 into 16,384 tokens, and ceil(16,384 / 16,384)
    # = 1 item. 0.9 casts the pixels to the model's dtype before they reach the GPU (0.8 kept them float32): held,
    # 16,384 × 3,584 × 2 = 117,440,512 B of outputs and 65,536 × 1,176 values × 2 = 154,140,672 B of pixels.
    found = profile(QWEN25_VL, "0.9.0.1", 2048, batched_tokens=2048)
    assert found is not None
    assert (found.modality, found.items, found.budget_tokens) == ("image", 1, 16_384)
    assert found.held_bytes == 117_440_512 + 154_140_672
    # The call: those pixels, the model's concatenated copy, no cast, and one block at its widest (14,100 values a
    # patch, as in 0.8 and 0.12): 2 × 154,140,672 + 65,536 × 14,100 × 2 = 2,156,396,544 B.
    assert found.encoder_peak_bytes == 2 * 154_140_672 + 1_848_115_200
    eight = profile(QWEN25_VL, "0.8.4", 2048, batched_tokens=2048)
    assert eight is not None and eight.encoder_peak_bytes == 2 * 308_281_344 + 154_140_672 + 1_848_115_200


def test_from_0_11_the_qwen25_vl_dummy_video_fills_max_model_len() -> None:
    # 0.12.0 at 32,768 tokens: 2 temporal patches of 16,384 (4 frames, under the cap of 14), built at max_model_len:
    # 131,072 patches, 32,768 tokens, which is also the item's maximum, so nothing is padded.
    found = profile(QWEN25_VL, "0.12.0", 32768)
    assert found is not None
    assert (found.patches_per_item, found.tokens_per_item, found.budget_tokens) == (131_072, 32_768, 32_768)


def test_a_launch_that_leaves_a_modality_out_profiles_the_other_or_nothing() -> None:
    only_images = profile(QWEN3_VL, "0.12.0", 65536, launch=EncoderLaunch(video_limit=0))
    assert only_images is not None and only_images.modality == "image"
    # The image processor's 16,777,216 pixels: 4,096² at 16-pixel patches, 256² = 65,536 patches, 16,384 tokens.
    assert (only_images.patches_per_item, only_images.budget_tokens) == (65_536, 16_384)
    assert profile(QWEN3_VL, "0.12.0", 65536, launch=EncoderLaunch(image_limit=0, video_limit=0)) is None
    assert profile(QWEN3_VL, "0.12.0", 65536, launch=EncoderLaunch(skipped=True)) is None


def test_the_launch_is_read_from_a_logs_arguments_as_vllm_prints_them() -> None:
    language_only = EncoderLaunch.from_arguments({"language_model_only": True})
    assert language_only.language_model_only and not language_only.profiles_encoder
    skipped = EncoderLaunch.from_arguments({"skip_mm_profiling": True})
    assert skipped.skipped and not skipped.profiles_encoder and not skipped.language_model_only  # a tower is built
    assert profile(QWEN3_VL, "0.12.0", 65536, launch=language_only) is None
    limits = EncoderLaunch.from_arguments({"limit_mm_per_prompt": {"image": 0, "video": {"count": 2}}})
    assert (limits.skipped, limits.image_limit, limits.video_limit) == (False, 0, 2)
    assert EncoderLaunch.from_arguments({"limit_mm_per_prompt": "{'image': 0}"}) == EncoderLaunch()


def test_only_the_qwen_vl_families_and_the_releases_read_are_priced() -> None:
    assert profile(_config("llava-hf--llava-1.5-7b-hf.json"), "0.12.0", 4096) is None
    assert profile(_config("Qwen--Qwen3-30B-A3B.json"), "0.12.0", 4096) is None
    assert profile(QWEN3_VL, "0.10.2", 65536) is None  # Qwen3-VL arrived in 0.11
    assert profile(QWEN25_VL, "0.8.1", 65536) is None
    assert profile(QWEN25_VL, "0.35.0", 65536) is None


def test_qwen25_vl_encoder_peaks_at_the_down_projection_beside_its_gated_inputs() -> None:
    # Qwen2.5-VL-7B at 0.12.0, 32,768 tokens: one 131,072-patch video. Qwen2_5_VisionMLP.forward keeps gate_up
    # (2 × 3,420) and its activated half (3,420) in locals while down_proj writes its output (1,280), beside the
    # block's input and its norm's output (2 × 1,280): 14,100 values a patch, 131,072 × 14,100 × 2 B =
    # 3,696,230,400 B, plus the bf16 pixels, 131,072 × 3 × 2 × 14² × 2 B = 308,281,344 B. No merged output yet:
    # the merger runs after the last block.
    one = profile(QWEN25_VL, "0.12.0", 32768)
    assert one is not None and one.encoder_peak_bytes == 3_696_230_400 + 308_281_344 == 4_004_511_744
    # Over two GPUs each rank holds half the MLP's widths (3 × 1,710) but the whole down output twice, its partial
    # sum and the all-reduced copy: 2,560 + 5,130 + 2,560 = 10,250 a patch, 2,686,976,000 B, plus the same pixels.
    two = profile(QWEN25_VL, "0.12.0", 32768, tensor_parallel_size=2)
    assert two is not None and two.encoder_peak_bytes == 131_072 * 10_250 * 2 + 308_281_344


def test_before_0_12_qwen25_vl_attention_gathers_qkv_and_outgrows_the_mlp_with_tp() -> None:
    # 0.11.0's split_qkv all-gathers qkv over the ranks (all_gather_interleave): this rank's qkv (3 × 1,280 / 2 =
    # 1,920) beside the gathered whole (3,840) and its reordered cat (3,840), with the block's input and norm
    # (2,560): 12,160 values a patch, more than the MLP's 10,250. 131,072 patches × 12,160 × 2 B = 3,187,671,040 B,
    # plus the same bf16 pixels as in 0.12.0 (308,281,344 B), which no longer gathers, and, before 0.12, the copy
    # the model concatenates the stacked dummy batch into (`_validate_and_reshape_mm_tensor`): as many bytes again.
    gathered = profile(QWEN25_VL, "0.11.0", 32768, tensor_parallel_size=2)
    assert gathered is not None and gathered.encoder_peak_bytes == 3_187_671_040 + 2 * 308_281_344
    one_gpu = profile(QWEN25_VL, "0.11.0", 32768)  # nothing to gather on one GPU: 0.12.0's moment, and the copy
    assert one_gpu is not None and one_gpu.encoder_peak_bytes == 4_004_511_744 + 308_281_344


def test_qwen3_vl_encoder_peaks_in_its_attention() -> None:
    # Qwen3-VL-30B-A3B at 0.13.0 profiles one 65,536-patch image. Its blocks use Qwen2_5_VisionAttention: qkv
    # (3 × 1,152), the q and k it copies out (2 × 1,152), their rotated copy (2 × 1,152) and the attention's output
    # (1,152) are alive as the projection writes its own (1,152): 10,368 values a patch, more than the MLP's fc1
    # output and activation (2 × 4,304 = 8,608). With the block's input and norm (2 × 1,152): 12,672 a patch,
    # 65,536 × 12,672 × 2 B = 1,660,944,384 B; plus the bf16 pixels (65,536 × 3 × 2 × 16² × 2 B = 201,326,592 B)
    # and the deepstack levels' merged tokens at most (16,384 × 2,048 × 4 × 2 B = 268,435,456 B).
    found = profile(QWEN3_VL, "0.13.0", 65536)
    assert found is not None
    assert found.encoder_peak_bytes == 1_660_944_384 + 201_326_592 + 268_435_456 == 2_130_706_432
