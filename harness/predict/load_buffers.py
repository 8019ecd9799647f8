"""Buffers vLLM builds while it loads a model: its "Model loading took" figure counts them beside the weights.

- The rotary embedding's cos/sin cache (vllm/model_executor/layers/rotary_embedding, `RotaryEmbedding.__init__`
  registers `cos_sin_cache`, positions × rotary dims, in the model's dtype), one for all layers (`get_rope`
  caches the instance) and whole on every GPU. Multimodal RoPE keeps four times the positions (mrope.py
  `MRotaryEmbedding`, "We enlarge max_position_embeddings to 4 times", read in 0.8.2 to 0.14.1); YaRN keeps the
  original positions times its factor (`YaRNScalingRotaryEmbedding._compute_cos_sin_cache`); Gemma 3's local
  layers have a rope of their own (`rope_local_base_freq`). On Qwen3-VL-30B-A3B that is 262,144 × 4 × 128 × 2 B
  = 256 MiB a GPU, what its logs load beyond the parameters at TP 2 and TP 4 alike.
- Qwen3-VL's deepstack inputs (qwen3_vl.py and qwen3_vl_moe.py `__init__`: one `torch.zeros(
  max_num_batched_tokens, hidden_size)` per deepstack level), whole on every GPU.
"""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError
from harness.predict.architectures import MAX_TOKENS, declared_architecture, language_config
from harness.predict.config_counts import stated_count
from harness.predict.term import Term

# Architectures whose vLLM model builds multimodal RoPE whether or not a trimmed config keeps its mrope_section.
MROPE_ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                       "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
                       "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
MROPE_POSITIONS_FACTOR = 4
ROTARY_SHARE_NAMES = ("partial_rotary_factor", "rotary_pct", "rotary_emb_fraction")  # vLLM's names for it, in order
NO_ROPE_ARCHITECTURES = ("OPTForCausalLM", "GPT2LMHeadModel", "JambaForCausalLM")  # learned positions, or none


def with_load_buffers(weights: Term, config: dict[str, Any], batched_tokens: int, dtype_bytes: int,
                      source: str = "config") -> Term:
    """The weights term with the buffers loading builds beside them, each named in its source."""
    parts = [part for part in (_rope_cache(config, dtype_bytes, source),
                               _deepstack_inputs(config, batched_tokens, dtype_bytes, source)) if part[0]]
    if not parts:
        return weights
    extra = sum(size for size, _ in parts)
    return weights.model_copy(update={"bytes": weights.bytes + extra,
                                      "source": weights.source + "; " + "; ".join(text for _, text in parts)})


def _rope_cache(config: dict[str, Any], dtype_bytes: int, source: str) -> tuple[int, str]:
    architecture = declared_architecture(config)
    if architecture in NO_ROPE_ARCHITECTURES:
        return 0, ""
    text = language_config(config)
    positions = stated_count(text, "max_position_embeddings", source)
    heads = stated_count(text, "num_attention_heads", source)
    width = stated_count(text, "hidden_size", source)
    head_dim = stated_count(text, "qk_rope_head_dim", source) or stated_count(text, "head_dim", source) or (
        width // heads if width and heads else None)
    if positions is None or head_dim is None:
        return 0, ""
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    rope = rope if isinstance(rope, dict) else {}
    rotary_dims = int(head_dim * _rotary_share(text, rope))
    kind = rope.get("rope_type") or rope.get("type")
    how = f"{positions:,} positions"
    if "mrope_section" in rope or architecture in MROPE_ARCHITECTURES:
        positions *= MROPE_POSITIONS_FACTOR
        how = f"{how} × 4 (multimodal RoPE)"
    elif kind in ("yarn", "deepseek_yarn"):
        original, scale = _yarn_scaling(rope, source)
        positions = int(original * scale)
        how = f"{original:,} original positions × YaRN factor {scale:g}"
    caches = 2 if "rope_local_base_freq" in text else 1
    size = caches * positions * rotary_dims * dtype_bytes
    return size, (f"{'two RoPE caches (global and local layers)' if caches == 2 else 'the RoPE cache'} of {how} × "
                  f"{rotary_dims} dims × {dtype_bytes} B, whole on every GPU ({size / 2**30:.2f} GiB)")


def _rotary_share(text: dict[str, Any], rope: dict[str, Any]) -> float:
    """The share of each head RoPE turns, where vLLM reads it (`patch_rope_parameters`, then `get_rope`'s
    rope_parameters["partial_rotary_factor"], read in 0.13 to 0.18): a top-level field under any of its names,
    else the one transformers 5 writes inside rope_parameters (Qwen3.5's configs keep it only there). A share
    that is no number in (0, 1] turns the whole head."""
    stated = [text[name] for name in ROTARY_SHARE_NAMES if text.get(name) is not None]
    share = stated[0] if stated else rope.get("partial_rotary_factor", 1.0)
    return float(share) if isinstance(share, int | float) and 0 < share <= 1 else 1.0


def _yarn_scaling(rope: dict[str, Any], source: str) -> tuple[int, float]:
    """YaRN's original positions and factor, whose product sizes the cache: a factor that is no positive number,
    or a product past any sequence, is refused rather than read as another length."""
    original = stated_count(rope, "original_max_position_embeddings", source, "rope_scaling.")
    scale = rope.get("factor")
    if original is None or isinstance(scale, bool) or not isinstance(scale, int | float) \
            or not 0 < scale * original <= MAX_TOKENS:
        raise HarnessError(f"{source}: a YaRN rope_scaling needs original_max_position_embeddings and a factor whose "
                           f"product is a length from 1 to {MAX_TOKENS:,} tokens, got {original!r} and {scale!r}")
    return original, float(scale)


def _deepstack_inputs(config: dict[str, Any], batched_tokens: int, dtype_bytes: int, source: str) -> tuple[int, str]:
    vision = config.get("vision_config")
    levels = vision.get("deepstack_visual_indexes") if isinstance(vision, dict) else None
    width = stated_count(language_config(config), "hidden_size", source)
    if not isinstance(levels, list) or not levels or width is None:
        return 0, ""
    size = len(levels) * batched_tokens * width * dtype_bytes
    return size, (f"Qwen3-VL's {len(levels)} deepstack input buffers of {batched_tokens:,} batched tokens × {width:,} "
                  f"({size / 2**30:.2f} GiB)")
