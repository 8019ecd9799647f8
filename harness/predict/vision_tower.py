"""The vision tower a vision-language checkpoint loads beside its text decoder, in parameters.

A VL config describes the decoder in `text_config` (or at its top level) and the image encoder in
`vision_config`; the decoder's count alone leaves the encoder out, which vLLM loads on every GPU (the
models' `__init__` builds it on every pipeline stage). Each family is counted as vLLM builds it, read in
vllm/model_executor/models (vllm-project/vllm): qwen2_5_vl.py and qwen2_vl.py at
002d181a55a03803d7d69547846630069d2378b8, qwen3_vl.py at 002d7b939754b844a3832dd7fbf9e5fd0c0e9f1b,
clip.py at 030ea52effcb05071543c8c42b8f0145e94cee43, llava.py,
gemma3_mm.py and pixtral.py at 0004c540861d3e59a7c1b3860f594aa8b24293db, siglip.py at
0531c2226a6a25cd96ccc856f3bda3f0bb4efb5f, mistral3.py at 02677fd9d49b6b4b3082967642a0d1ff45c36c0a.
Their attention and MLP linears are vLLM's column- and row-parallel layers, so each rank holds 1/TP of
the weights (a row-parallel bias whole); norms, patch and position embeddings, Gemma 3's projection
matrix and Mistral 3's patch merger are held whole on every rank.
"""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import BaseModel

from harness.errors import HarnessError
from harness.predict.architectures import declared_architecture
from harness.predict.config_counts import needed_count, stated_count
from harness.predict.encoder_profile import QWEN2_VL_ARCHITECTURES, QWEN3_VL_ARCHITECTURES

# LlavaConfig's default `vision_feature_layer`: the tower is built only up to the layer the features come from.
LLAVA_FEATURE_LAYER = -2
MAX_RATIO = 1024  # an MLP wider than this many times its input is a malformed config, not a tower
TOWER_ARCHITECTURES = (*QWEN2_VL_ARCHITECTURES, *QWEN3_VL_ARCHITECTURES,
                       "Gemma3ForConditionalGeneration", "LlavaForConditionalGeneration",
                       "Mistral3ForConditionalGeneration")  # the architectures whose tower is sized here
ENCODER_NAMES = {"clip_vision_model": "CLIP", "siglip_vision_model": "SigLIP", "pixtral": "Pixtral"}


class VisionTower(BaseModel, frozen=True):
    """Parameters of the image encoder and its projector into the decoder's width."""

    name: str
    split_params: int  # in tensor-parallel linears: each rank holds 1/TP
    whole_params: int  # held whole on every rank

    def bytes_per_gpu(self, dtype_bytes: int, tensor_parallel_size: int) -> float:
        return (self.split_params / tensor_parallel_size + self.whole_params) * dtype_bytes


Count = tuple[int, int]  # (split over TP, whole on every rank)


def vision_tower(config: dict[str, Any], source: str = "config") -> VisionTower | None:
    """The tower a modelled VL architecture loads, or None for a text-only config."""
    vision = config.get("vision_config")
    architecture = declared_architecture(config)
    if architecture not in TOWER_ARCHITECTURES:
        return None
    if not isinstance(vision, dict):  # dropping it would leave the tower's weights and profile out unsaid
        raise HarnessError(f"{source}: {architecture} loads a vision tower, so field 'vision_config' must give its "
                           f"sizes, got {reprlib.repr(vision)}")
    text_config = config.get("text_config")
    text = {**config, **text_config} if isinstance(text_config, dict) else config
    if architecture in QWEN2_VL_ARCHITECTURES:
        qwen25 = architecture.startswith("Qwen2_5")
        count = (_qwen2_5_vl if qwen25 else _qwen2_vl)(vision, source)
        return _tower(f"{'Qwen2.5-VL' if qwen25 else 'Qwen2-VL'} vision transformer", count)
    if architecture in QWEN3_VL_ARCHITECTURES:  # qwen3_5.py builds qwen3_vl.py's Qwen3_VisionTransformer
        return _tower("Qwen3-VL vision transformer", _qwen3_vl(vision, source))
    if architecture == "Gemma3ForConditionalGeneration":
        width = _field(vision, "hidden_size", source)
        projector = (0, width * _field(text, "hidden_size", source, "") + width)  # mm_input_projection_weight + norm
        return _tower("SigLIP vision tower", _add(_encoder(vision, None, source), projector))
    if architecture in ("LlavaForConditionalGeneration", "Mistral3ForConditionalGeneration"):
        mistral3 = architecture.startswith("Mistral3")
        layers = _feature_layers(config, vision, -1 if mistral3 else LLAVA_FEATURE_LAYER, source)
        projector = _mistral3_projector(config, vision, text, source) if mistral3 else _llava_projector(
            config, vision, text, source)
        name = ENCODER_NAMES.get(str(vision.get("model_type")), "vision")
        return _tower(f"{name} vision tower", _add(_encoder(vision, layers, source), projector))
    return None


def _tower(name: str, count: Count) -> VisionTower:
    return VisionTower(name=name, split_params=count[0], whole_params=count[1])


def _column(inputs: int, outputs: int, bias: bool) -> Count:
    """A column-parallel linear: weight and bias both split over TP."""
    return inputs * outputs + (outputs if bias else 0), 0


def _row(inputs: int, outputs: int, bias: bool) -> Count:
    """A row-parallel linear: weight split over TP, bias whole on every rank."""
    return inputs * outputs, outputs if bias else 0


def _add(*counts: Count) -> Count:
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def _times(count: Count, factor: int) -> Count:
    return count[0] * factor, count[1] * factor


def _qwen2_5_vl(v: dict[str, Any], source: str) -> Count:
    """Qwen2_5_VisionTransformer: patch embedding, blocks of RMSNorms + qkv/proj + gated MLP, patch merger."""
    width, inner = _field(v, "hidden_size", source), _field(v, "intermediate_size", source)
    merged = width * _field(v, "spatial_merge_size", source) ** 2
    block = _add(_column(width, 3 * width, True), _row(width, width, True), _column(width, 2 * inner, True),
                 _row(inner, width, True), (0, 2 * width))
    merger = _add((0, width), _column(merged, merged, True), _row(merged, _field(v, "out_hidden_size", source), True))
    return _add(_patch_embedding(v, width, source), _times(block, _field(v, "depth", source)), merger)


def _qwen2_vl(v: dict[str, Any], source: str) -> Count:
    """Qwen2VisionTransformer: as Qwen2.5-VL's but LayerNorms and a plain fc1/fc2 MLP of embed_dim × mlp_ratio."""
    width = _field(v, "embed_dim", source)
    inner = int(width * _ratio(v, "mlp_ratio", 4, source))
    merged = width * _field(v, "spatial_merge_size", source) ** 2
    block = _add(_column(width, 3 * width, True), _row(width, width, True), _column(width, inner, True),
                 _row(inner, width, True), (0, 4 * width))
    merger = _add((0, 2 * width), _column(merged, merged, True), _row(merged, _field(v, "hidden_size", source), True))
    return _add(_patch_embedding(v, width, source), _times(block, _field(v, "depth", source)), merger)


def _qwen3_vl(v: dict[str, Any], source: str) -> Count:
    """Qwen3_VisionTransformer: a biased Conv3d patch embedding, learned position embeddings, LayerNorm blocks of
    qkv/proj and an fc1/fc2 MLP, the patch merger, and one more merger per deepstack layer (its norm over the
    merged width, `use_postshuffle_norm`)."""
    width, inner = _field(v, "hidden_size", source), _field(v, "intermediate_size", source)
    merged, out = width * _field(v, "spatial_merge_size", source) ** 2, _field(v, "out_hidden_size", source)
    block = _add(_column(width, 3 * width, True), _row(width, width, True), _column(width, inner, True),
                 _row(inner, width, True), (0, 4 * width))

    def merger(norm_width: int) -> Count:
        return _add((0, 2 * norm_width), _column(merged, merged, True), _row(merged, out, True))

    embeddings = _add(_patch_embedding(v, width, source), (0, width),
                      (0, _field(v, "num_position_embeddings", source) * width))
    deepstack = v.get("deepstack_visual_indexes") or []
    if not isinstance(deepstack, list):
        raise HarnessError(f"{source}: field 'vision_config.deepstack_visual_indexes' must be a list of layer indices")
    blocks = _times(block, _field(v, "depth", source))
    return _add(embeddings, blocks, merger(width), _times(merger(merged), len(deepstack)))


def _patch_embedding(v: dict[str, Any], width: int, source: str) -> Count:
    """The Conv3d patch embedding, held whole (ReplicatedLinear), no bias."""
    channels = _optional(v, "in_channels", _optional(v, "in_chans", 3, source), source)
    patch = _field(v, "patch_size", source)
    return 0, channels * _optional(v, "temporal_patch_size", 2, source) * patch * patch * width


def _encoder(v: dict[str, Any], layers: int | None, source: str) -> Count:
    """A CLIP, SigLIP or Pixtral encoder of `layers` layers (all of them when None)."""
    kind = v.get("model_type")
    width, inner = _field(v, "hidden_size", source), _field(v, "intermediate_size", source)
    patch = _field(v, "patch_size", source)
    total = _field(v, "num_hidden_layers", source)
    depth = total if layers is None else layers
    channels = _optional(v, "num_channels", 3, source)
    if kind == "pixtral":  # RMSNorms, bias-free qkv/o and gated MLP, a bias-free patch conv and ln_pre
        layer = _add(_column(width, 3 * width, False), _row(width, width, False), _column(width, 2 * inner, False),
                     _row(inner, width, False), (0, 2 * width))
        return _add((0, channels * patch * patch * width + width), _times(layer, depth))
    if kind not in ("clip_vision_model", "siglip_vision_model"):
        raise HarnessError(f"{source}: vision_config.model_type {kind!r} is not a vision tower sized here "
                           "(known: clip_vision_model, siglip_vision_model, pixtral)")
    positions = (_field(v, "image_size", source) // patch) ** 2
    layer = _add(_column(width, 3 * width, True), _row(width, width, True), _column(width, inner, True),
                 _row(inner, width, True), (0, 4 * width))
    if kind == "clip_vision_model":  # class embedding, bias-free patch conv, positions + 1, pre-LayerNorm
        embeddings = (0, width + channels * patch * patch * width + (positions + 1) * width + 2 * width)
        return _add(embeddings, _times(layer, depth))  # llava.py builds it without post_layernorm
    embeddings = (0, channels * patch * patch * width + width + positions * width)  # conv with bias
    post_norm = (0, 2 * width) if depth == total else (0, 0)
    head = _siglip_head(width, inner) if v.get("vision_use_head", True) else (0, 0)
    return _add(embeddings, _times(layer, depth), post_norm, head)


def _siglip_head(width: int, inner: int) -> Count:
    """SigLIP's attention-pooling head: a probe, torch's MultiheadAttention (whole), a LayerNorm and an MLP."""
    return _add((0, width + 3 * width * width + 3 * width + width * width + width + 2 * width),
                _column(width, inner, True), _row(inner, width, True))


def _feature_layers(config: dict[str, Any], v: dict[str, Any], default: int, source: str) -> int:
    """Layers built up to the deepest feature layer (llava.py `_get_num_hidden_layers`)."""
    total = _field(v, "num_hidden_layers", source)
    chosen = config.get("vision_feature_layer", default)
    indices = chosen if isinstance(chosen, list) else [chosen]
    if not indices or not all(isinstance(index, int) and not isinstance(index, bool) for index in indices):
        raise HarnessError(f"{source}: field 'vision_feature_layer' must be a layer index or a list of them")
    return max(total + index + 1 if index < 0 else index for index in indices)


def _llava_projector(config: dict[str, Any], v: dict[str, Any], text: dict[str, Any], source: str) -> Count:
    """LlavaMultiModalProjector: vision width → text width → text width, biased unless the config says not."""
    bias = bool(config.get("multimodal_projector_bias", True))
    width = _field(text, "hidden_size", source, "")
    return _add(_column(_field(v, "hidden_size", source), width, bias), _row(width, width, bias))


def _mistral3_projector(config: dict[str, Any], v: dict[str, Any], text: dict[str, Any], source: str) -> Count:
    """Mistral3MultiModalProjector: an RMSNorm, the patch merger's whole bias-free linear, then two linears."""
    vision_width, width = _field(v, "hidden_size", source), _field(text, "hidden_size", source, "")
    bias = bool(config.get("multimodal_projector_bias", False))
    merger = vision_width * _optional(config, "spatial_merge_size", 2, source, "") ** 2 * vision_width
    return _add((0, vision_width + merger), _column(vision_width, width, bias), _row(width, width, bias))


def _field(section: dict[str, Any], name: str, source: str, where: str = "vision_config.") -> int:
    return needed_count(section, name, source, "to size the vision tower", where)


def _optional(section: dict[str, Any], name: str, default: int, source: str, where: str = "vision_config.") -> int:
    """A field the builder defaults when the config leaves it out; stated, it must be a positive integer."""
    stated = stated_count(section, name, source, where)
    return default if stated is None else stated


def _ratio(section: dict[str, Any], name: str, default: float, source: str) -> float:
    value = section.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < MAX_RATIO:
        raise HarnessError(f"{source}: field 'vision_config.{name}' must be a positive number, got {value!r}")
    return float(value)
