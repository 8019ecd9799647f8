"""Before launch: what V1's profiling run holds for a Qwen vision-language model's encoder.

vLLM's `profile_run` first runs the vision encoder on a dummy batch of the modality whose item brings the most
tokens (`get_modality_with_max_tokens`, each item's maximum taken at max_model_len), keeps its outputs in the
encoder cache through the decoder's dummy run over the batched tokens and the sampler's, and frees them only
after. The profile's peak is therefore the larger of the encoder call's own widest moment and what it leaves held
(the outputs, in 0.11-0.12 also the zero-padded copies it scatters them into, and, in the first GPU runner, the
dummy pixels) plus the decoder's or the sampler's peak. Read in every release's wheel from 0.8.2 to 0.34.0 (0.9.1
aside, between 0.9.0 and 0.9.2, whose profiles agree) (vllm/v1/worker/gpu_model_runner.py and gpu/model_runner.py
`profile_run`, vllm/v1/worker/utils.py and vllm/multimodal/encoder_budget.py `MultiModalBudget`,
vllm/v1/core/encoder_cache_manager.py `compute_encoder_budget`, vllm/config/vllm.py's choice of runner, and
vllm/model_executor/models/qwen2_vl.py, qwen3_vl.py and qwen3_5.py `*ProcessingInfo` and `*DummyInputsBuilder`);
`RULES` says what changed where.

The largest image and video come from the checkpoint's image (and, for Qwen3-VL, video) processor: its pixel
bounds live in preprocessor_config.json, not config.json, so the Qwen releases' own values are taken
(`VisionProcessor`); a checkpoint that changes them, or a launch that overrides them with --mm-processor-kwargs,
is not followed.
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

from packaging.version import Version
from pydantic import BaseModel

from harness.predict.architectures import declared_architecture
from harness.predict.config_counts import needed_count, stated_count
from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.model_runner import runs_second_runner
from harness.units import GiB

QWEN2_VL_ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
QWEN3_VL_ARCHITECTURES = ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                          "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# The MoE models among them: with the hybrid Qwen3.5, they keep the first GPU runner until 0.29 (model_runner.py).
MOE_VL_ARCHITECTURES = ("Qwen3VLMoeForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
SECOND_RUNNER_ENCODER_SINCE = Version("0.27")  # the second runner's profile_run runs no encoder before 0.27
QWEN3_VL_SINCE = {"Qwen3_5ForConditionalGeneration": Version("0.17"), "Qwen3_5MoeForConditionalGeneration":
                  Version("0.17")}  # the Qwen3-VL models themselves from 0.11
QWEN3_VL_MAX_FRAMES = 24_576  # qwen3_vl.py _MAX_FRAMES_PER_VIDEO (0.11.0-0.14.1)
LARGEST_SIDE = 9_999_999  # before 0.13 the largest image is what the processor makes of a 9,999,999² one
MAX_ASPECT = 200  # the processors refuse a wider image
ENCODER_PROFILED_SINCE = Version("0.8.2")
NEWEST_READ_BEFORE = Version("0.35")  # releases from here on are not priced until their profile_run is read
# Before 0.12 the dummy batch reaches the model stacked, [items, patches, values] (`MultiModalKwargs.batch`), and the
# model concatenates it into a copy of its own (`_validate_and_reshape_mm_tensor`, qwen2_vl.py, qwen2_5_vl.py and
# qwen3_vl.py, read in 0.8.3, 0.10.2 and 0.11.0); from 0.12 these models take it flat (`merge_by_field_config`).
# Float32 pixels (before 0.9) are also cast to the model's dtype for the encoder (`.type(self.visual.dtype)`); 0.9.0's
# `MultiModalKwargs.as_kwargs` casts them before they reach the GPU, and from 0.9.2 the processor's output is cast
# (`InputProcessingContext.call_hf_processor`).
FLAT_BATCH_SINCE = Version("0.12")


class VisionProcessor(BaseModel, frozen=True):
    """A checkpoint's image (and video) processor bounds, in pixels: the largest item the profile builds."""

    image_min_pixels: int
    image_max_pixels: int
    video_min_pixels: int | None = None  # Qwen3-VL's video processor bounds all frames together
    video_max_pixels: int | None = None
    source: str


QWEN2_VL_PROCESSOR = VisionProcessor(
    image_min_pixels=3_136, image_max_pixels=12_845_056,
    source="Qwen2-VL and Qwen2.5-VL's preprocessor_config.json (min_pixels 3136, max_pixels 12845056)")
QWEN3_VL_PROCESSOR = VisionProcessor(
    image_min_pixels=65_536, image_max_pixels=16_777_216, video_min_pixels=4_096, video_max_pixels=25_165_824,
    source="Qwen3-VL's preprocessor_config.json (size 65536 to 16777216 pixels) and video_preprocessor_config.json "
           "(4096 to 25165824 pixels over the whole video)")


class Rules(NamedTuple):
    """How one range of releases builds the encoder's dummy batch."""

    limit_per_prompt: int  # --limit-mm-per-prompt's default per modality
    images_before_video: bool  # the largest image's tokens come off the video's token budget first
    qwen2_max_frames: int  # qwen2_vl.py _MAX_FRAMES_PER_VIDEO
    budget_counts_limits: bool  # each modality's largest item is sized beside every modality's limit, not one of each
    dummy_length: Literal["batch", "item", "model"]  # the seq_len the dummy item is built for
    dummy_counts_limits: bool  # the dummy item is built beside every modality's limit, not its own modality alone
    items: Literal["ceil", "floor", "budget"]  # how many items of the budget the dummy batch holds
    padded_to: Literal["none", "budget", "item"]  # the zero tensors outputs are scattered into before caching
    pixel_bytes: int | None  # the dummy pixels' bytes each: float32 before 0.9, the model's dtype (None) after
    qwen3_timestamp_factor: float  # Qwen3-VL counts each video token this many times in the budget
    factorised_image: bool  # the largest image is max_pixels factorised into patches, not a resized giant square
    qwen3_two_frame_video: bool  # Qwen3-VL's largest video is two frames at the video processor's pixel bound
    video_wins_ties: bool  # get_modality_with_max_tokens breaks a tie by name from 0.17 ("video" > "image")


RULES = (  # (first release, its rules), newest last
    (Version("0.8.2"), Rules(1, True, 16, True, "batch", True, "ceil", "none", 4, 1.0, False, False, False)),
    (Version("0.8.3"), Rules(1, True, 16, True, "batch", False, "ceil", "none", 4, 1.0, False, False, False)),
    (Version("0.8.4"), Rules(999, True, 16, False, "batch", False, "ceil", "none", 4, 1.0, False, False, False)),
    (Version("0.9.0"), Rules(999, True, 16, False, "batch", False, "ceil", "none", None, 1.0, False, False, False)),
    (Version("0.10.0"), Rules(999, True, 16, False, "item", False, "floor", "none", None, 1.0, False, False, False)),
    (Version("0.10.1"), Rules(999, True, 16, False, "batch", False, "budget", "none", None, 1.0, False, False, False)),
    (Version("0.10.2"), Rules(999, False, 16, False, "batch", False, "budget", "none", None, 1.0, False, False, False)),
    (Version("0.11.0"), Rules(999, False, 14, False, "model", False, "budget", "budget", None, 12.5, False, False,
                              False)),
    (Version("0.12.0"), Rules(999, False, 14, False, "model", False, "budget", "item", None, 12.5, False, False,
                              False)),
    (Version("0.13.0"), Rules(999, False, 14, False, "model", False, "budget", "none", None, 1.0, True, False, False)),
    (Version("0.15.0"), Rules(999, False, 14, False, "model", False, "budget", "none", None, 1.0, True, True, False)),
    (Version("0.17.0"), Rules(999, False, 14, False, "model", False, "budget", "none", None, 1.0, True, True, True)),
)


class EncoderProfile(BaseModel, frozen=True):
    """The encoder's part of the profile: its dummy batch and the bytes it holds, on one GPU."""

    modality: str
    items: int
    patches_per_item: int
    tokens_per_item: int  # the encoder's output tokens for one dummy item
    budget_tokens: int  # the encoder budget: the larger of the batched tokens and the largest item's tokens
    held_bytes: int  # outputs, padded copies and pixels, alive through the decoder's and the sampler's runs
    encoder_peak_bytes: int  # the encoder call's widest moment, the pixels and the model's copies of them included
    source: str


class VisionGeometry(NamedTuple):
    """A Qwen vision transformer's sizes, as its vision_config states them."""

    architecture: str
    qwen3: bool
    patch: int
    merge: int
    temporal: int
    channels: int
    width: int  # the blocks' hidden size
    inner: int  # the MLP's hidden size
    gated: bool  # Qwen2.5-VL's SiLU MLP has gate and up projections
    out_width: int  # each output token's width into the decoder (Qwen3-VL: with its deepstack levels)


def encoder_profile(config: dict[str, Any], engine_version: Version, *, max_model_len: int, batched_tokens: int,
                    max_num_seqs: int, tensor_parallel_size: int, dtype_bytes: int,
                    launch: EncoderLaunch | None = None, source: str = "config") -> EncoderProfile | None:
    """The encoder profile of a Qwen2-VL, Qwen2.5-VL, Qwen3-VL or Qwen3.5 checkpoint under V1; None for other
    models, a launch that skips it, a release whose runner does not profile the encoder or whose rules were not
    read."""
    launch = launch or EncoderLaunch()
    geometry = vision_geometry(config, source)
    if geometry is None or not launch.profiles_encoder or not _read(engine_version, geometry):
        return None
    runner = _runner(engine_version, geometry.architecture)
    if runner == "none":
        return None
    rules = next(r for since, r in reversed(RULES) if engine_version >= since)
    stated = {"image": launch.image_limit, "video": launch.video_limit}
    limits = {name: rules.limit_per_prompt if limit is None else limit for name, limit in stated.items()}
    if not any(limits.values()):
        return None
    processor = QWEN3_VL_PROCESSOR if geometry.qwen3 else QWEN2_VL_PROCESSOR
    items = LargestItems(geometry, processor, rules, limits)
    per_item = {"image": items.image_patches // geometry.merge**2,
                "video": items.video_budget_tokens(max_model_len)}
    per_item = {name: tokens for name, tokens in per_item.items() if limits[name]}
    modality = max(per_item, key=lambda name: (per_item[name], rules.video_wins_ties and name == "video"))
    largest = per_item[modality]
    budget = max(batched_tokens, largest)
    count = _item_count(rules, budget, largest, max_model_len, max_num_seqs, limits[modality])
    dummy_length = {"batch": batched_tokens, "item": largest, "model": max_model_len}[rules.dummy_length]
    patches = items.image_patches if modality == "image" else items.dummy_video_patches(dummy_length)
    tokens = patches // geometry.merge**2
    outputs = count * tokens * geometry.out_width * dtype_bytes
    pad_rows = {"none": 0, "budget": budget, "item": largest}[rules.padded_to]
    padded = count * pad_rows * geometry.out_width * dtype_bytes if tokens < pad_rows else 0
    pixel_bytes = rules.pixel_bytes or dtype_bytes
    pixels = count * patches * geometry.channels * geometry.temporal * geometry.patch**2 * pixel_bytes
    held_pixels = pixels if runner == "first" else 0  # the second runner frees them before the decoder's run
    copied = pixels if engine_version < FLAT_BATCH_SINCE else 0
    cast = pixels // pixel_bytes * dtype_bytes if pixel_bytes != dtype_bytes else 0
    peak = pixels + copied + cast + widest_block_bytes(geometry, count * patches, tensor_parallel_size, dtype_bytes,
                                                       engine_version)
    return EncoderProfile(
        modality=modality, items=count, patches_per_item=patches, tokens_per_item=tokens, budget_tokens=budget,
        held_bytes=outputs + padded + held_pixels, encoder_peak_bytes=peak,
        source=(f"the vision encoder on {count} dummy {modality} item(s) of {patches:,} patches ({tokens:,} tokens; "
                f"the largest {modality} counts {largest:,} at max_model_len, encoder budget {budget:,} tokens), "
                f"holding {outputs / GiB:.2f} GiB of outputs"
                + (f", {padded / GiB:.2f} GiB of zero-padded copies ({pad_rows:,} rows each)" if padded else "")
                + (f" and {held_pixels / GiB:.2f} GiB of pixels" if held_pixels else "")
                + f" through the decoder's dummy run ({processor.source})"),
    )


def _read(engine_version: Version, geometry: VisionGeometry) -> bool:
    """Whether this release's profile of this family was read: 0.8.2 to 0.34, Qwen3-VL from 0.11."""
    since = QWEN3_VL_SINCE.get(geometry.architecture, Version("0.11") if geometry.qwen3 else ENCODER_PROFILED_SINCE)
    return since <= engine_version < NEWEST_READ_BEFORE


def _runner(engine_version: Version, architecture: str) -> Literal["first", "second", "none"]:
    """Which GPU runner profiles the model by default (model_runner.py: a dense one the second from 0.25, an MoE or
    hybrid one from 0.29); the second ran no encoder in 0.25 and 0.26 and frees the pixels before the decoder's
    run from 0.27."""
    if not runs_second_runner(engine_version, architecture, architecture in MOE_VL_ARCHITECTURES, False, None):
        return "first"
    return "none" if engine_version < SECOND_RUNNER_ENCODER_SINCE else "second"


def vision_geometry(config: dict[str, Any], source: str) -> VisionGeometry | None:
    """A Qwen2-VL, Qwen2.5-VL, Qwen3-VL or Qwen3.5 checkpoint's vision transformer; None for any other model."""
    architecture = declared_architecture(config)
    vision = config.get("vision_config")
    if architecture not in QWEN2_VL_ARCHITECTURES + QWEN3_VL_ARCHITECTURES or not isinstance(vision, dict):
        return None

    def field(name: str) -> int:
        return needed_count(vision, name, source, "to size the vision encoder's profile", "vision_config.")

    def optional(name: str, default: int) -> int:
        stated = stated_count(vision, name, source, "vision_config.")
        return default if stated is None else stated

    qwen3 = architecture in QWEN3_VL_ARCHITECTURES
    qwen2 = architecture == "Qwen2VLForConditionalGeneration"
    width = field("embed_dim") if qwen2 else field("hidden_size")
    inner = width * 4 if qwen2 else field("intermediate_size")  # Qwen2-VL: embed_dim × mlp_ratio 4
    out = field("hidden_size") if qwen2 else field("out_hidden_size")
    deepstack = vision.get("deepstack_visual_indexes") or []
    levels = 1 + (len(deepstack) if qwen3 and isinstance(deepstack, list) else 0)
    return VisionGeometry(architecture=architecture, qwen3=qwen3, patch=field("patch_size"),
                     merge=field("spatial_merge_size"), temporal=optional("temporal_patch_size", 2),
                     channels=optional("in_channels", 3), width=width, inner=inner,
                     gated=architecture == "Qwen2_5_VLForConditionalGeneration", out_width=out * levels)


class LargestItems:
    """The processing info's sizes of the largest image and video (qwen2_vl.py, qwen3_vl.py `_get_vision_info`)."""

    def __init__(self, geometry: VisionGeometry, processor: VisionProcessor, rules: Rules,
                 limits: dict[str, int]) -> None:
        self.geometry, self.processor, self.rules, self.limits = geometry, processor, rules, limits
        self.unit = geometry.patch * geometry.merge
        self.size = self._largest_image(processor.image_max_pixels)
        self.image_patches = self._patches(1, self.size)

    def _largest_image(self, max_pixels: int) -> tuple[int, int]:
        """(height, width) of `get_image_size_with_most_features`: from 0.13 the most patches that factorise under
        the aspect bound, before it what the processor makes of a giant square."""
        if self.rules.factorised_image:
            for units in range(max_pixels // self.unit**2, 0, -1):
                short = next(d for d in range(math.isqrt(units), 0, -1) if units % d == 0)
                if units // short / short <= MAX_ASPECT:
                    return short * self.unit, units // short * self.unit
        side = _image_resize(LARGEST_SIDE, self.unit, self.processor.image_min_pixels, max_pixels)
        return side, side

    def _patches(self, frames: int, size: tuple[int, int]) -> int:
        grid_t = max((frames + frames % self.geometry.temporal) // self.geometry.temporal, 1)
        return grid_t * (size[0] // self.geometry.patch) * (size[1] // self.geometry.patch)

    def video_patches(self, frames: int, size: tuple[int, int] | None = None) -> int:
        """One video of `frames` frames at the largest image's size, as the processor resizes it (Qwen3-VL's video
        processor bounds the pixels of all its frames together)."""
        size = size or self.size
        if self.geometry.qwen3 and frames > 1:
            size = _video_resize(frames, size, self.unit, self.geometry.temporal,
                                 self.processor.video_min_pixels or 0, self.processor.video_max_pixels or 0)
        return self._patches(frames, size)

    def video_budget_tokens(self, max_model_len: int) -> int:
        """The largest video's tokens as the budget counts them (Qwen3-VL 0.11-0.12: with their timestamp text)."""
        if self.geometry.qwen3 and self.rules.qwen3_two_frame_video:
            return self._two_frame_video() // self.geometry.merge**2
        counts_limits = self.rules.budget_counts_limits
        images = self.limits["image"] if counts_limits else min(self.limits["image"], 1)
        image_tokens = self.image_patches // self.geometry.merge**2
        available = max_model_len - (images * image_tokens if self.rules.images_before_video else 0)
        videos = self.limits["video"] if counts_limits else 1
        tokens = self.video_patches(self.frames(available, videos)) // self.geometry.merge**2
        return int(tokens * self.rules.qwen3_timestamp_factor) if self.geometry.qwen3 else tokens

    def dummy_video_patches(self, seq_len: int) -> int:
        """The dummy video the encoder runs on (0.8.2 built it beside its image limit's worth of images)."""
        if self.geometry.qwen3 and self.rules.qwen3_two_frame_video:
            return self._two_frame_video()
        counted = self.rules.dummy_counts_limits and self.rules.images_before_video
        images = self.limits["image"] * self.image_patches // self.geometry.merge**2 if counted else 0
        frames = self.frames(seq_len - images, self.limits["video"] if self.rules.dummy_counts_limits else 1)
        return self.video_patches(max(frames, 2) if self.geometry.qwen3 else frames)

    def _two_frame_video(self) -> int:
        """Qwen3-VL from 0.15: two frames at the largest image under the video bound halved for its temporal pair."""
        bound = (self.processor.video_max_pixels or 0) // self.geometry.temporal
        return self.video_patches(2, self._largest_image(bound))

    def frames(self, max_tokens: int, videos: int) -> int:
        """`get_num_frames_with_most_features`: the most frames whose tokens fit (`_get_max_video_frames`), shared
        by `videos` videos, capped per video."""
        cap = QWEN3_VL_MAX_FRAMES if self.geometry.qwen3 else self.rules.qwen2_max_frames
        videos = max(videos, 1)
        frames = 2 if self.geometry.qwen3 else 1
        while frames < cap * videos and self.video_patches(frames + 1) // self.geometry.merge**2 <= max_tokens:
            frames += 1
        return max(min(frames // videos, cap), 1)


def _item_count(rules: Rules, budget: int, largest: int, max_model_len: int, max_num_seqs: int, limit: int) -> int:
    if rules.items == "ceil":  # 0.8: cdiv(budget, per item), at most max_num_seqs × the limit
        return min(-(-budget // largest), max_num_seqs * limit)
    if rules.items == "floor":
        return max(1, min(budget // largest, max_num_seqs * limit))
    per_prompt = max(1, min(limit, max_model_len // largest))  # MultiModalBudget.get_max_items
    return max(1, min(budget // largest, max_num_seqs * per_prompt))


def _gathers_qkv(architecture: str, engine_version: Version) -> bool:
    """Whether the vision attention all-gathers qkv over the TP ranks before taking its heads (`split_qkv`, read in
    0.8.3, 0.10.2, 0.11.0, 0.12.0, 0.13.0, 0.23.0 and 0.34.0): Qwen2-VL's in every release but 0.12, Qwen2.5-VL's
    before 0.12, Qwen3-VL's never."""
    if architecture == "Qwen2VLForConditionalGeneration":
        return not Version("0.12") <= engine_version < Version("0.13")
    return architecture == "Qwen2_5_VLForConditionalGeneration" and engine_version < Version("0.12")


def widest_block_bytes(geometry: VisionGeometry, patches: int, tensor_parallel_size: int, dtype_bytes: int,
                       engine_version: Version) -> int:
    """One vision block over every patch of the batch at its widest, beside the block's input and its norm's output.
    The MLP: Qwen2-VL's and Qwen3-VL's fc1 output is freed once activated, so fc2's output sits beside the activation
    alone; Qwen2.5-VL's `Qwen2_5_VisionMLP.forward` keeps gate_up's output and its activated half in locals while
    down_proj writes its output; with TP the down projection's partial sum and its all-reduced copy are both alive.
    The attention (`Qwen2_5_VisionAttention.forward` from 0.12, Qwen3-VL's too; earlier code holds no less): this
    rank's qkv, its q and k copied out and rotated, the attention's output, the projection's. Where it all-gathers
    qkv with TP: this rank's, the whole and its reordered copy (`all_gather`'s movedim, `all_gather_interleave`'s
    cat). Qwen3-VL holds the deepstack levels' merged tokens too; Qwen2-VL and Qwen2.5-VL merge after the last block."""
    g, tp = geometry, tensor_parallel_size
    inner = g.inner / tp
    output = g.width * (2 if tp > 1 else 1)
    mlp = 3 * inner + output if g.gated else max(2 * inner, inner + output)
    attention = (3 + 2 + 2 + 1) * g.width / tp + output
    gathers = _gathers_qkv(g.architecture, engine_version) and tp > 1
    gather = 3 * g.width / tp + 2 * 3 * g.width if gathers else 0
    deepstack = patches // g.merge**2 * g.out_width if g.qwen3 else 0
    return int((patches * (2 * g.width + max(mlp, attention, gather)) + deepstack) * dtype_bytes)


def _image_resize(side: int, factor: int, min_pixels: int, max_pixels: int) -> int:
    """transformers' qwen2_vl `smart_resize` of a square image: the side it keeps."""
    kept = round(side / factor) * factor
    if kept * kept > max_pixels:
        beta = math.sqrt(side * side / max_pixels)
        return max(factor, math.floor(side / beta / factor) * factor)
    if kept * kept < min_pixels:
        beta = math.sqrt(min_pixels / (side * side))
        return math.ceil(side * beta / factor) * factor
    return kept


def _video_resize(frames: int, size: tuple[int, int], factor: int, temporal: int, min_pixels: int,
                  max_pixels: int) -> tuple[int, int]:
    """transformers' qwen3_vl video `smart_resize`: the pixel bounds hold for the whole video."""
    height, width = size
    kept = (round(height / factor) * factor, round(width / factor) * factor)
    kept_frames = round(frames / temporal) * temporal
    if kept_frames * kept[0] * kept[1] > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        return (max(factor, math.floor(height / beta / factor) * factor),
                max(factor, math.floor(width / beta / factor) * factor))
    if kept_frames * kept[0] * kept[1] < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        return math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return kept
