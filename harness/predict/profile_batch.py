"""Before launch: the batch vLLM's profiling run pushes through the model, by engine, release and GPU.

The activation peak the profile measures is the forward pass over this batch's tokens and the sampler over its
rows (`activation.py`), beside what its inputs hold. Each default is the release's own, read in its wheel.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from packaging.version import Version
from pydantic import BaseModel

from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.encoder_profile import QWEN2_VL_PROCESSOR, RULES, LargestItems, vision_geometry, widest_block_bytes
from harness.predict.engine_launch import EngineLaunch
from harness.predict.gpu_catalog import shares_host_memory
from harness.predict.parameter_count import ModelSize
from harness.units import GiB

# V1's API-server batch defaults (`_v1_defaults`): by the GPU's memory from 0.8.5, by its name before
LARGE_BATCH_SINCE = Version("0.8.5")
V1_MANY_SEQUENCES_SINCE = Version("0.8")  # 1,024 sequences on every GPU, until 0.8.4 asks for an H100 or H200 too
V1_SEQUENCES_BY_NAME_SINCE = Version("0.8.4")
A100_SMALL_BATCH_SINCE = Version("0.9")  # "a100" not in device_name, PR #17885 (read in 0.9.0 … 0.34.0)
LARGE_GPU_BYTES = 70 * GiB
LARGEST_BATCH_SINCE = Version("0.28")  # B200, B300, MI300X: `get_batch_defaults` (read in 0.28.0 … 0.34.0)
LARGEST_GPU_BYTES = 160 * GiB
V0_CHUNKED_ABOVE = 32_768  # V0 turns chunked prefill on (512-token batches) above this length
V0_MULTIMODAL_BATCHED_TOKENS = 5_120  # V0's floor on a multimodal model's batched tokens
V0_MLA_UNCHUNKED_SINCE = Version("0.8.2")  # V0 keeps an MLA model's prefill whole, whatever its length
V0_READ = ((Version("0.7.2"), Version("0.9")), (Version("0.10"), Version("0.11")))  # V0 _dummy_run, as read
V0_DUMMY_KEPT_SINCE = Version("0.8.3")  # a V0 dummy prompt longer than its share keeps its placeholders
V0_LIMIT_PER_PROMPT = 1  # --limit-mm-per-prompt's V0 default per modality ("1 (V0) or 999 (V1)")


def profiling_batch(version: Version, v0: bool, total_bytes: int, max_model_len: int,
                    max_num_batched_tokens: int | None, max_num_seqs: int | None,
                    gpu_name: str | None = None, multimodal: bool = False,
                    mla: bool = False) -> tuple[int, int, str, int]:
    """(tokens, sampler rows) of vLLM's profiling run, where they come from, and the scheduler's max_num_seqs.

    V0's `_dummy_run` spreads the tokens over max_num_seqs sequences (256 unless set) and samples each; V1's
    `_dummy_run` makes min(tokens, max_num_seqs) requests and samples one row per request.
    """
    if v0:
        tokens, source = ((max_num_batched_tokens, "--max-num-batched-tokens") if max_num_batched_tokens
                          else _v0_batched_tokens(version, max_model_len, multimodal, mla))
        return tokens, max_num_seqs or 256, source, max_num_seqs or 256
    tokens, rows, source = _v1_defaults(version, total_bytes, gpu_name)
    if max_num_batched_tokens:
        tokens, source = max_num_batched_tokens, "--max-num-batched-tokens"
    sequences = max_num_seqs or rows
    return tokens, min(sequences, tokens), source, sequences


def _v0_batched_tokens(version: Version, max_model_len: int, multimodal: bool, mla: bool) -> tuple[int, str]:
    """V0's default batch: max(max_model_len, 2048) without chunked prefill, 512 tokens with it, which V0 turns on
    past 32,768 tokens of context. It never chunks a multimodal model's prefill and batches at least 5,120 tokens
    for one (engine/arg_utils.py `_set_default_args_v0`, config.py `SchedulerConfig`:
    `_MULTIMODAL_MODEL_MAX_NUM_BATCHED_TOKENS`, read in 0.6.5, 0.7.2, 0.8.3, 0.8.5 and 0.10.2), nor, from 0.8.2, an
    MLA model's ("Chunked prefill not supported for Multimodal or MLA in V0", read in 0.8.2-0.8.5 and
    0.10.0-0.10.2; 0.7.2 turns it off only after sizing the 512-token batch)."""
    if multimodal:
        return (max(max_model_len, 2048, V0_MULTIMODAL_BATCHED_TOKENS),
                "V0 default for a multimodal model, never chunked: max(max_model_len, 2048, 5120)")
    unchunked_mla = mla and version >= V0_MLA_UNCHUNKED_SINCE
    if max_model_len > V0_CHUNKED_ABOVE and not unchunked_mla:
        return 512, "V0 default with chunked prefill (max_model_len above 32,768)"
    return max(max_model_len, 2048), "V0 default without chunked prefill: max(max_model_len, 2048)" + (
        " (MLA is never chunked in V0)" if unchunked_mla and max_model_len > V0_CHUNKED_ABOVE else "")


def _v1_defaults(version: Version, total_bytes: int, gpu_name: str | None) -> tuple[int, int, str]:
    """V1's API-server defaults (engine/arg_utils.py): before 0.8.5 by the device's name, an H100 or H200 batching
    8,192 tokens and any other 2,048, with 1,024 sequences on every GPU in 0.8.0-0.8.3, on those two in 0.8.4 and 256
    otherwise (read in 0.7.2, 0.8.2, 0.8.3 and 0.8.4); from 0.8.5 by its memory (`_set_default_args_v1`, later
    `get_batch_defaults`): ≥ 70 GiB 8,192 tokens and 1,024 sequences, but not an A100 from 0.9 (PR #17885),
    ≥ 160 GiB 16,384 and 1,024 from 0.28, else 2,048 and 256. A GB10 takes the last whatever its memory: NVML
    reports none for the integrated part, so `get_device_total_memory` raises and the memory counts as 0, until
    0.33 falls back to CUDA's total and keeps the GB10 "on the small tier" by its compute capability, 12.1
    (platforms/cuda.py and `get_batch_defaults`, read in 0.11.0 … 0.34.0)."""
    name = (gpu_name or "").lower()
    if version < LARGE_BATCH_SINCE:
        hopper = "h100" in name or "h200" in name
        rows = 1024 if version >= V1_MANY_SEQUENCES_SINCE and (hopper or version < V1_SEQUENCES_BY_NAME_SINCE) else 256
        return (8192, rows, "V1 default on an H100 or H200, by name (before 0.8.5)") if hopper else (
            2048, rows, "V1 default")
    if shares_host_memory(gpu_name):
        return 2048, 256, "V1 default on a GB10 (NVML gives vLLM no memory figure; from 0.33 its capability)"
    if version >= LARGEST_BATCH_SINCE and total_bytes >= LARGEST_GPU_BYTES:
        return 16384, 1024, "V1 default on a ≥ 160 GiB GPU from 0.28"
    a100 = "a100" in name and version >= A100_SMALL_BATCH_SINCE
    if total_bytes >= LARGE_GPU_BYTES and not a100:
        return 8192, 1024, "V1 default on a ≥ 70 GiB GPU"
    return 2048, 256, "V1 default (an A100 from 0.9)" if a100 else "V1 default"


class V0DecoderDummy(BaseModel, frozen=True):
    """V0's profiling batch of a Qwen2-VL or Qwen2.5-VL model: how many dummy prompts, their tokens together, the
    pixels their images and videos bring, what the forward pass holds of them beside the decoder, and its
    encoder's widest moment."""

    sequences: int
    tokens: int
    pixel_bytes: int
    held_bytes: int
    encoder_peak_bytes: int
    source: str


def v0_decoder_dummy(config: dict[str, Any], engine_version: Version, *, max_model_len: int, batched_tokens: int,
                     max_num_seqs: int, hidden: int, tensor_parallel_size: int = 1, dtype_bytes: int = 2,
                     launch: EncoderLaunch | None = None, source: str = "config") -> V0DecoderDummy | None:
    """V0's `_dummy_run` (worker/model_runner.py, read in 0.7.2, 0.8.2-0.8.5 and 0.10.0-0.10.2) gives each dummy
    prompt every image and video the limits allow, each at its largest, so it first cuts max_num_seqs to
    max_num_batched_tokens // those tokens (at least one). From 0.8.3 a prompt whose placeholders outgrow its share
    of the batch keeps them all (multimodal/profiling.py `get_decoder_dummy_data` only warns), and the decoder runs
    over every one; 0.8.2 and earlier profiled such a prompt as text of its share. None for other models and for
    releases not read.

    The pixels reach the model as keyword arguments (`MultiModalKwargs.as_kwargs`, moved to the GPU in the
    processor's dtype, batched as [sequences, patches, values]), and the model concatenates them into a copy of
    its own (qwen2_vl.py and qwen2_5_vl.py `_validate_and_reshape_mm_tensor`, read in 0.7.2, 0.8.3 and 0.10.2):
    both are held through the forward pass. V0 runs the encoder inside it (`get_input_embeddings_v0`), images then
    videos, after the text's input embeddings exist and with each modality's pixels cast to the model's dtype."""
    launch = launch or EncoderLaunch()
    geometry = vision_geometry(config, source)
    if geometry is None or geometry.qwen3 or not any(start <= engine_version < end for start, end in V0_READ):
        return None
    rules = next((r for since, r in reversed(RULES) if engine_version >= since), RULES[0][1])
    limits = {"image": V0_LIMIT_PER_PROMPT if launch.image_limit is None else launch.image_limit,
              "video": V0_LIMIT_PER_PROMPT if launch.video_limit is None else launch.video_limit}
    if not any(limits.values()):
        return None
    items = LargestItems(geometry, QWEN2_VL_PROCESSOR, rules, limits)
    merged = geometry.merge**2

    def patches(seq_len: int) -> tuple[int, int]:
        """One dummy prompt's image and video patches for this length (qwen2_vl.py
        `get_num_frames_with_most_features`: the videos share what the images leave, at least a frame each)."""
        images = limits["image"] * items.image_patches
        if not limits["video"]:
            return images, 0
        frames = items.frames(seq_len - (images // merged if rules.images_before_video else 0), limits["video"])
        return images, limits["video"] * items.video_patches(frames)

    largest = sum(patches(max_model_len)) // merged  # the registry's get_max_multimodal_tokens, at max_model_len
    sequences = max(1, min(max_num_seqs, batched_tokens // largest))
    shares = [batched_tokens // sequences + (i < batched_tokens % sequences) for i in range(sequences)]
    kept = engine_version >= V0_DUMMY_KEPT_SINCE
    counts = [patches(share) for share in shares]  # 0.8.2 and earlier drop them where they outgrow the share
    carried = [count if kept or sum(count) // merged <= share else (0, 0)
               for share, count in zip(shares, counts, strict=True)]
    tokens = sum(max(share, sum(count) // merged) for share, count in zip(shares, carried, strict=True))
    values = geometry.channels * geometry.temporal * geometry.patch**2  # each patch's pixel values
    pixel_bytes = sum(map(sum, carried)) * values * (rules.pixel_bytes or dtype_bytes)
    cast_each = dtype_bytes if rules.pixel_bytes not in (None, dtype_bytes) else 0  # `.type(self.visual.dtype)`
    before_encoder = 2 * pixel_bytes + tokens * hidden * dtype_bytes
    encoder_peak = max((before_encoder + count * values * cast_each
                        + widest_block_bytes(geometry, count, tensor_parallel_size, dtype_bytes, engine_version)
                        for count in map(sum, zip(*carried, strict=True)) if count), default=0)
    return V0DecoderDummy(
        sequences=sequences, tokens=tokens, pixel_bytes=pixel_bytes, held_bytes=2 * pixel_bytes,
        encoder_peak_bytes=encoder_peak,
        source=(f"V0's dummy prompts: {sequences} of {max_num_seqs} sequence(s), each allowed "
                f"{limits['image']} image(s) and {limits['video']} video(s) of {largest:,} tokens in all at "
                f"max_model_len" + (f"; kept whole beyond their {shares[0]:,}-token share, {tokens:,} tokens "
                                    f"through the decoder" if tokens > batched_tokens else "")
                + f", beside {2 * pixel_bytes / GiB:.2f} GiB of their pixels and the model's copy"
                + (f"; the encoder inside the forward pass at its widest {encoder_peak / GiB:.2f} GiB, with the "
                   "text's input embeddings" if encoder_peak else "")),
    )


class ProfileBatch(NamedTuple):
    """vLLM's profiling run: the tokens through the forward pass, the rows sampled, what the batch's own inputs
    hold beside them (a V0 vision model's pixels), and the widest moment of an encoder run inside that pass (V0);
    and the scheduler's max_num_seqs, which sizes the runner's per-request state."""

    tokens: int
    rows: int
    held_bytes: int
    encoder_peak_bytes: int
    source: str
    max_num_seqs: int


def profile_batch(config: dict[str, Any], size: ModelSize, version: Version, v0: bool, launch: EngineLaunch,
                  total_bytes: int, gpu_name: str | None, config_source: str = "config") -> ProfileBatch:
    """This model's profiling run: `profiling_batch`, and for a Qwen2-VL model on V0 the dummy prompts that carry
    its images and videos (`v0_decoder_dummy`)."""
    tokens, rows, source, max_num_seqs = profiling_batch(
        version, v0, total_bytes, launch.max_model_len, launch.max_num_batched_tokens, launch.max_num_seqs, gpu_name,
        multimodal=size.vision is not None, mla=size.whole_mixer_params > 0)
    dummy = None if not v0 else v0_decoder_dummy(
        config, version, max_model_len=launch.max_model_len, batched_tokens=tokens, max_num_seqs=rows,
        hidden=size.hidden, tensor_parallel_size=launch.tensor_parallel_size, dtype_bytes=launch.dtype_bytes,
        launch=launch.encoder, source=config_source)
    if dummy is None:
        return ProfileBatch(tokens, rows, 0, 0, source, max_num_seqs)
    return ProfileBatch(dummy.tokens, dummy.sequences, dummy.held_bytes, dummy.encoder_peak_bytes,
                        f"{source}; {dummy.source}", max_num_seqs)
