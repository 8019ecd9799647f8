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


def speculative_from_log(method: str | None, tokens: int | None) -> SpeculativeDecoding | None:
    """The drafter a log names, None when it names none; releases before the unified "mtp" name the model's
    own ("deepseek_mtp", ...)."""
    if method is None:
        return None
    name = sized_method(method)
    if name is None:
        raise HarnessError(f"speculative method '{method}': its drafter's cache is not sized here")
    if tokens is None:
        raise HarnessError(f"speculative method '{method}': the log does not state its speculative tokens")
    if not tokens_in_range(tokens):
        raise HarnessError(f"speculative method '{method}': {tokens} speculative tokens, not 1 to "
                           f"{MAX_SPECULATIVE_TOKENS}")
    return SpeculativeDecoding(method=name, num_speculative_tokens=tokens)


def speculative_from_options(method: str | None, tokens: int | None) -> SpeculativeDecoding | None:
    """`--speculative-method` and `--num-speculative-tokens` (the fields of vLLM's --speculative-config) as the
    one drafter value the calculator takes; None when no method is given."""
    if method is None:
        if tokens is not None:
            raise HarnessError(f"--num-speculative-tokens {tokens}: give --speculative-method too")
        return None
    name = sized_method(method)
    if name is None:
        raise HarnessError(f"--speculative-method '{method}': its drafter's cache is not sized here (sized: "
                           f"{', '.join(get_args(SpeculativeMethod))})")
    if tokens is None:
        raise HarnessError(f"--speculative-method '{method}': give --num-speculative-tokens")
    if not tokens_in_range(tokens):
        raise HarnessError(f"--num-speculative-tokens: {tokens}, not 1 to {MAX_SPECULATIVE_TOKENS}")
    return SpeculativeDecoding(method=name, num_speculative_tokens=tokens)


def sized_method(method: str) -> SpeculativeMethod | None:
    """The method whose drafter cache is sized here, or None (a separate draft model, an MLP speculator, ...)."""
    name = "mtp" if method.endswith("mtp") else method
    methods: tuple[SpeculativeMethod, ...] = get_args(SpeculativeMethod)
    return next((known for known in methods if known == name), None)


def tokens_in_range(tokens: int) -> bool:
    """The calculator's bound on speculative tokens; vLLM's own is only a positive count (`gt=0` on
    num_speculative_tokens, vllm/config/speculative.py at 002e77c1)."""
    return 1 <= tokens <= MAX_SPECULATIVE_TOKENS
