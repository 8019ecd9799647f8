"""Which model architectures the calculator knows how to read, by the name a config gives them.

A config's fields can look like attention even when the model is not (a Qwen3 config relabelled
`MambaForCausalLM` still has heads and head_dim), and a state-space model's fields are not the ones
the calculator sizes. So the `architectures` field decides first: a name outside this list is refused
by name, before any field is priced, and a name known not to fit the model is refused with the reason.
"""

from __future__ import annotations

import functools
import os
import reprlib
from typing import Any

from packaging.version import Version

from harness.errors import HarnessError

# Decoders whose KV cache is fully described by the fields model_shape reads: heads, head_dim or
# hidden_size, sliding-window layouts, MLA latents, and the two hybrid state layouts it sizes
# (Jamba's Mamba-1 layers, the gated delta net of Qwen3-Next and Qwen3.5, whose configs nest it in text_config).
MODELLED_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
    "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
    "Phi3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "JambaForCausalLM", "GptOssForCausalLM",
    "Glm4ForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM", "Starcoder2ForCausalLM",
    "Mistral3ForConditionalGeneration", "LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
    "OPTForCausalLM", "GPT2LMHeadModel", "PhiForCausalLM", "InternLM2ForCausalLM", "Glm4MoeForCausalLM",
    # Llama-shaped, full attention on every layer as their layer_types say; SmolLM3's NoPE layers (no_rope_layers)
    # skip only the rotary embedding and keep their KV cache, Exaone4's extra norms are not counted
    "SmolLM3ForCausalLM", "Exaone4ForCausalLM",
    # per-layer-type heads and shared-KV layers (layer_variants.py); their weights are not counted (below)
    "Gemma4ForConditionalGeneration", "Gemma4ForCausalLM",
})
# Architectures vLLM serves whose memory this calculator would misstate, and why: refused by name, with the reason.
REFUSED_ARCHITECTURES = {
    "MllamaForConditionalGeneration": "its cross-attention layers keep each request's image tokens in a cache of "
                                      "their own (vLLM's encoder-decoder cache), which is not sized here",
    "Llama4ForConditionalGeneration": "three in four of its layers attend within chunks of attention_chunk_size "
                                      "tokens (chunked local attention), a cache layout not sized here",
    "InternVLChatModel": "the weights of its InternViT vision tower are not counted here",
    "KimiVLForConditionalGeneration": "the weights of its MoonViT vision tower are not counted here",
    "Phi3VForCausalLM": "the weights of its CLIP image processor are not counted here",
    "MambaForCausalLM": "a pure state-space model: it keeps a fixed state per sequence, no KV cache to size",
    "Mamba2ForCausalLM": "a pure state-space model: it keeps a fixed state per sequence, no KV cache to size",
    "HunYuanMoEV1ForCausalLM": "with use_cla, layers past every cla_share_factor-th reuse an earlier layer's K/V "
                               "(cross-layer attention), and its shared expert is intermediate_size × "
                               "num_shared_expert wide: neither is sized here",
}
# Architectures whose KV cache is sized here but whose weights are not counted, and why: a budget from given or
# logged KV memory serves them, the before-launch waterfall refuses them by name.
UNCOUNTED_WEIGHTS = dict.fromkeys(
    ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"),
    "Gemma 4's per-layer embeddings, its full-attention layers without a V projection (attention_k_eq_v), the "
    "dense MLP beside its experts and its vision and audio towers are not counted here")
# Families whose MLP is one up and one down projection (fc1/fc2, c_fc/c_proj), not a gated gate/up/down triple.
UNGATED_MLP_ARCHITECTURES = frozenset({"OPTForCausalLM", "GPT2LMHeadModel", "PhiForCausalLM", "Starcoder2ForCausalLM"})
# Families served by vLLM's LlamaMLP (llama.py, read in 0.6.3, 0.6.4, 0.8.3, 0.10.2, 0.13.0, 0.20.0, 0.27.0 and
# 0.34.0; Mistral's and Phi-3's through it, GLM-4's as Glm4MLP, read in 0.10.2 and 0.13.0), and a multimodal
# wrapper's language model by its model_type.
LLAMA_MLP_ARCHITECTURES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM", "Glm4ForCausalLM"})
LLAMA_MLP_MODEL_TYPES = frozenset({"llama", "mistral"})
# LlamaMLP kept its up projection's output in `gate_up` through 0.6.3; from 0.6.4 it rebinds `x` to it and then to
# its activation, so it is freed before the down projection runs.
LLAMA_MLP_REBINDS_SINCE = Version("0.6.4")
# Field names some families use for what the calculator reads; GPT-2's come from its transformers config class.
WIDTH_ALIASES = {"ffn_dim": "intermediate_size", "n_inner": "intermediate_size"}  # OPT's and GPT-2's MLP width


# The counts a config's weights and cache are sized from: whole numbers wherever a config states them (null is
# "not stated"); another type would surface later as a failed sum instead of the field's name.
COUNT_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
    "n_routed_experts", "num_local_experts", "n_shared_experts", "num_experts_per_tok", "experts_per_token",
    "first_k_dense_replace", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "max_position_embeddings", "sliding_window", "max_window_layers", "attn_layer_offset", "mamba_expand",
    "mamba_d_conv", "global_head_dim", "num_global_key_value_heads", "num_kv_shared_layers",
)
# Of them, the ones a model cannot hold none of (a zero would be read as "not stated" and take a fallback).
POSITIVE_FIELDS = frozenset({"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                             "head_dim", "vocab_size"})
# The ones a model with routed experts cannot hold none of: dense configs of MoE families (Granite 4, Qwen3.5)
# state zero experts of zero width, which is no MoE layer at all.
EXPERT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts")
POSITIVE_MOE_FIELDS = ("moe_intermediate_size", "num_experts_per_tok")
MAX_TOKENS = 2**40  # tokens in one sequence or a whole live population (~1.1 trillion)
LENGTH_FIELDS = frozenset({"max_position_embeddings", "sliding_window"})  # tokens, bounded as a sequence is
MAX_WIDTH = 2**24  # any other count past 16.7 million (a width, a vocabulary, experts) is a malformed config
MAX_LAYERS = 4096  # served decoders hold at most a few hundred; more is a malformed config, not a model
FLAG_FIELDS = ("tie_word_embeddings", "use_sliding_window")  # true or false where stated: "no" is not false
# Sections read field by field: a string or a list in their place would otherwise read as "not stated", and a
# quantized checkpoint would be priced at 16 bits a weight.
# (vision_config is checked where a vision tower is sized, which names the architecture needing it.)
SECTION_FIELDS = ("text_config", "quantization_config", "rope_scaling", "rope_parameters")


def check_counts(config: dict[str, Any], source: str) -> None:
    """Refuse, by field, a count no model states (see `_check_count`), an MoE model's experts of no width, KV heads
    that do not share the query heads evenly, or a field of the wrong kind (see `_check_kinds`)."""
    for field in COUNT_FIELDS:
        _check_count(field, config.get(field), source)
    if any(config.get(field) for field in EXPERT_FIELDS):
        for field in POSITIVE_MOE_FIELDS:
            if config.get(field) == 0:
                raise HarnessError(f"{source}: field '{field}' is 0 in a model with routed experts: it must be a "
                                   "positive whole number")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise HarnessError(f"{source}: field 'num_key_value_heads' {kv_heads} does not divide num_attention_heads "
                           f"{heads}: each KV head serves a whole group of query heads")
    _check_kinds(config, source)


def _check_kinds(config: dict[str, Any], source: str) -> None:
    """A flag that is not true or false, a section that is not a mapping, a layer list that is not a list of names."""
    for flag in FLAG_FIELDS:
        if config.get(flag) is not None and not isinstance(config[flag], bool):
            raise HarnessError(f"{source}: field '{flag}' must be true or false, got {config[flag]!r}")
    for section in SECTION_FIELDS:
        if config.get(section) is not None and not isinstance(config[section], dict):
            raise HarnessError(f"{source}: field '{section}' must be a mapping of fields, got "
                               f"{reprlib.repr(config[section])}")
    kinds = config.get("layer_types")
    if kinds is not None and not (isinstance(kinds, list) and all(isinstance(kind, str) for kind in kinds)):
        raise HarnessError(f"{source}: field 'layer_types' must be a list of layer kinds, got {reprlib.repr(kinds)}")


def _check_count(field: str, value: Any, source: str) -> None:
    """A stated count is a whole number, not zero where a model needs one (zero would read as "not stated" and
    take a fallback), and within what any model holds."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HarnessError(f"{source}: field '{field}' must be a whole number, got {value!r}")
    if value == 0 and field in POSITIVE_FIELDS:
        raise HarnessError(f"{source}: field '{field}' must be a positive whole number, got 0")
    bound = MAX_LAYERS if field == "num_hidden_layers" else MAX_TOKENS if field in LENGTH_FIELDS else MAX_WIDTH
    if value > bound:
        what = "layers than a model holds" if field == "num_hidden_layers" else "than any model holds"
        raise HarnessError(f"{source}: field '{field}' is {value:,}, more {what} (at most {bound:,} are read)")


def check_architectures(config: dict[str, Any], source: str, notes: list[str]) -> None:
    """Refuse a config whose declared architecture the calculator does not model; note a missing one."""
    declared = config.get("architectures")
    if declared is None:
        notes.append("no 'architectures' field: the layer layout is read from the config's fields alone")
        return
    if not isinstance(declared, list) or not declared or not all(isinstance(name, str) for name in declared):
        raise HarnessError(f"{source}: field 'architectures' must be a list of names, got {declared!r}")
    refused = [name for name in declared if name in REFUSED_ARCHITECTURES]
    if refused:
        raise HarnessError(f"{source}: architecture {refused[0]} is refused: {REFUSED_ARCHITECTURES[refused[0]]}")
    unsupported = [name for name in declared if name not in MODELLED_ARCHITECTURES]
    if unsupported:
        raise HarnessError(
            f"{source}: unsupported architecture {unsupported[0]} (the calculator models "
            f"{len(MODELLED_ARCHITECTURES)} decoder architectures, e.g. LlamaForCausalLM, Qwen3ForCausalLM, "
            "JambaForCausalLM; pure state-space models are not among them)"
        )
    notes.append(f"architecture {declared[0]}")


def declared_architecture(config: dict[str, Any]) -> str | None:
    """The first architecture the config declares, where it declares one by name."""
    declared = config.get("architectures")
    first = declared[0] if isinstance(declared, list) and declared else None
    return first if isinstance(first, str) else None


def check_weights_counted(config: dict[str, Any], source: str) -> None:
    """Refuse, by name, an architecture whose KV cache is sized here but whose weights are not counted."""
    declared = config.get("architectures")
    uncounted = [name for name in declared if name in UNCOUNTED_WEIGHTS] if isinstance(declared, list) else []
    if uncounted:
        name = uncounted[0]
        raise HarnessError(f"{source}: the weights of {name} are not modelled: {UNCOUNTED_WEIGHTS[name]}; give the "
                           "KV memory instead (--available-kv-gib or --kv-cache-memory-bytes, or the start-up log "
                           "to harness capacity)")


def language_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields under the names the calculator reads, with its family's defaults where absent.

    A multimodal config nests them (`text_config`); GPT-2 names them `n_embd`, `n_layer`, ... (its transformers
    config class's `attribute_map` says which) and OPT its MLP width `ffn_dim`. A config that leaves out
    `tie_word_embeddings` takes its family's default, which differs: True for GPT-2, OPT, Gemma and Starcoder2,
    False for Llama or Qwen2 (read from the transformers config class, as the checkpoint loader reads it).
    """
    nested = config.get("text_config")
    merged = {**config, **nested} if isinstance(nested, dict) else dict(config)
    for alias, field in WIDTH_ALIASES.items():
        if merged.get(field) is None and merged.get(alias) is not None:
            merged[field] = merged[alias]
    if "hidden_size" in merged and "tie_word_embeddings" in merged:
        return merged  # most configs: nothing to look up, and transformers is not imported
    family = _config_class(str(merged.get("model_type") or ""))
    for field, alias in getattr(family, "attribute_map", {}).items():
        if field not in merged and alias in merged:
            merged[field] = merged[alias]
    if "tie_word_embeddings" not in merged and isinstance(getattr(family, "tie_word_embeddings", None), bool):
        merged["tie_word_embeddings"] = family.tie_word_embeddings
    return merged


def mlp_projections(config: dict[str, Any]) -> int:
    """Weight matrices of hidden × intermediate in one dense MLP: 2 ungated (up, down), 3 gated (gate, up, down)."""
    declared = config.get("architectures") or []
    return 2 if any(name in UNGATED_MLP_ARCHITECTURES for name in declared) else 3


def mlp_keeps_up_output(config: dict[str, Any], version: Version) -> bool:
    """Whether the dense MLP's up-projection output stays alive while its down projection runs: not in the ungated
    fc1/fc2 MLPs, which rebind one name, nor in LlamaMLP from 0.6.4; in the others (Qwen2MLP, GemmaMLP, ...), which
    hold it in `gate_up` until they return, and in a family not read (the larger figure)."""
    if mlp_projections(config) == 2:
        return False
    declared = config.get("architectures") or []
    text = config.get("text_config")
    text_type = text.get("model_type") if isinstance(text, dict) else None
    llama = any(name in LLAMA_MLP_ARCHITECTURES for name in declared) or (
        isinstance(text_type, str) and text_type in LLAMA_MLP_MODEL_TYPES)
    return not llama or version < LLAMA_MLP_REBINDS_SINCE


@functools.cache
def _config_class(model_type: str) -> Any:
    """transformers' config class for a model_type, or None for one the installed release does not know."""
    if not model_type:
        return None
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # only configuration is read: no PyTorch needed
    from transformers import CONFIG_MAPPING

    # the mapping is lazy: only [] and `in` load a class (its dict's own .get would find nothing)
    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None  # noqa: SIM401
