"""Which model architectures the calculator knows how to read, by the name a config gives them.

A config's fields can look like attention even when the model is not (a Qwen3 config relabelled
`MambaForCausalLM` still has heads and head_dim), and a state-space model's fields are not the ones
the calculator sizes. So the `architectures` field decides first: a name outside this list is refused
by name, before any field is priced.
"""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError

# Decoders whose KV cache is fully described by the fields model_shape reads: heads, head_dim or
# hidden_size, sliding-window layouts, MLA latents, and the two hybrid state layouts it sizes
# (Jamba's Mamba-1 layers, Qwen3-Next's gated delta net).
MODELLED_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
    "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration",
    "Phi3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "JambaForCausalLM", "GptOssForCausalLM",
    "Glm4ForCausalLM", "GraniteForCausalLM", "Olmo2ForCausalLM", "Starcoder2ForCausalLM",
    "Mistral3ForConditionalGeneration", "LlavaForConditionalGeneration",
})


def check_architectures(config: dict[str, Any], source: str, notes: list[str]) -> None:
    """Refuse a config whose declared architecture the calculator does not model; note a missing one."""
    declared = config.get("architectures")
    if declared is None:
        notes.append("no 'architectures' field: the layer layout is read from the config's fields alone")
        return
    if not isinstance(declared, list) or not declared or not all(isinstance(name, str) for name in declared):
        raise HarnessError(f"{source}: field 'architectures' must be a list of names, got {declared!r}")
    unsupported = [name for name in declared if name not in MODELLED_ARCHITECTURES]
    if unsupported:
        raise HarnessError(
            f"{source}: unsupported architecture {unsupported[0]} (the calculator models "
            f"{len(MODELLED_ARCHITECTURES)} decoder architectures, e.g. LlamaForCausalLM, Qwen3ForCausalLM, "
            "JambaForCausalLM; pure state-space models are not among them)"
        )
    notes.append(f"architecture {declared[0]}")
