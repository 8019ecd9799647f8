"""Speculative decoding's drafter in the KV cache: the layers it adds beside the target model's.

vLLM registers the drafter's attention layers in the same KV cache as the target's, so they join its
groups and share its block pool. An MTP drafter runs the model's own multi-token-prediction layers
(Qwen3-Next's and Qwen3.5's `mtp_num_hidden_layers`, DeepSeek's and GLM's `num_nextn_predict_layers`),
each an attention layer of the target's kind; an EAGLE or EAGLE-3 head is one decoder layer whose
attention has the target's layout (the published heads copy its KV heads and head size). N-gram, suffix
and Medusa drafting keep no cache. A separate draft model has layers of its own, which are not sized here.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, Field

from harness.errors import HarnessError
from harness.predict.model_shape import LayerKind, LayerSpec, ModelShape

SpeculativeMethod = Literal["mtp", "eagle", "eagle3", "ngram", "suffix", "medusa"]
CACHELESS_METHODS = frozenset({"ngram", "suffix", "medusa"})
EAGLE_METHODS = frozenset({"eagle", "eagle3"})
MAX_SPECULATIVE_TOKENS = 64


class SpeculativeDecoding(BaseModel, extra="forbid", frozen=True):
    """`--speculative-config`'s method and its speculative tokens per step."""

    method: SpeculativeMethod
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPECULATIVE_TOKENS)


def draft_layers(speculative: SpeculativeDecoding | None, shape: ModelShape, assumptions: list[str]) -> list[LayerSpec]:
    """The KV-cache layers the drafter adds: the MTP layers, one EAGLE layer, or none."""
    if speculative is None or speculative.method in CACHELESS_METHODS:
        return []
    attention = next((layer for layer in shape.layers
                      if layer.kind in (LayerKind.FULL_ATTENTION, LayerKind.MLA)), None)
    if attention is None:
        raise HarnessError(f"{shape.name}: {speculative.method} drafting asked for, but the model has no "
                           "full-attention layer whose layout its drafter copies")
    if speculative.method in EAGLE_METHODS:
        assumptions.append(f"{speculative.method} drafting {speculative.num_speculative_tokens} tokens: one more "
                           "attention layer, of the target's layout")
        return [attention]
    if not shape.mtp_layers:
        raise HarnessError(f"{shape.name}: MTP drafting asked for, but the config has no mtp_num_hidden_layers "
                           "or num_nextn_predict_layers")
    assumptions.append(f"MTP drafting {speculative.num_speculative_tokens} tokens: {shape.mtp_layers} more "
                       f"{attention.kind.value} layer(s)")
    return [attention] * shape.mtp_layers


def speculative_from_log(method: str, tokens: int | None) -> SpeculativeDecoding:
    """The drafter a log names; releases before the unified "mtp" name the model's own ("deepseek_mtp", ...)."""
    name = "mtp" if method.endswith("mtp") else method
    if name not in get_args(SpeculativeMethod):
        raise HarnessError(f"speculative method '{method}': its drafter's cache is not sized here")
    if tokens is None:
        raise HarnessError(f"speculative method '{method}': the log does not state its speculative tokens")
    if not 1 <= tokens <= MAX_SPECULATIVE_TOKENS:
        raise HarnessError(f"speculative method '{method}': {tokens} speculative tokens, not 1 to "
                           f"{MAX_SPECULATIVE_TOKENS}")
    return SpeculativeDecoding(method=name, num_speculative_tokens=tokens)
