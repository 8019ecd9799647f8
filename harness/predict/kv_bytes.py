"""Bytes one layer's KV cache takes, per token or per sequence, on one tensor-parallel rank.

The unit both budget directions build on: the forward budget multiplies it by a population, the
capacity prediction divides an available-memory figure by it.
"""

from __future__ import annotations

import math
from typing import Any

from harness.errors import HarnessError
from harness.predict.architectures import language_config
from harness.predict.model_shape import LayerKind, LayerSpec

KV_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}
KV_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "fp32": "float32"}


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: str) -> tuple[str, int]:
    """vLLM's --kv-cache-dtype name → (dtype, bytes per element); 'auto' follows the model."""
    name = model_dtype if kv_cache_dtype.lower() == "auto" else kv_cache_dtype.lower()
    name = KV_DTYPE_ALIASES.get(name, name)
    if name not in KV_DTYPE_BYTES:
        choices = ", ".join(["auto", *KV_DTYPE_ALIASES, *KV_DTYPE_BYTES])
        raise HarnessError(f"unknown kv cache dtype '{kv_cache_dtype}' (choose from {choices})")
    return name, KV_DTYPE_BYTES[name]


def check_attention_heads(config: dict[str, Any], tensor_parallel_size: int) -> None:
    """vLLM refuses a tensor-parallel size that does not divide the attention heads (ModelConfig
    `verify_with_parallel_config`: "Total number of attention heads (H) must be divisible by tensor parallel
    size (T)"), so no figure is given for one; a config naming no heads passes, as it does there."""
    heads = language_config(config).get("num_attention_heads") if config else None
    if isinstance(heads, int) and heads % tensor_parallel_size:
        raise HarnessError(f"tensor_parallel_size {tensor_parallel_size} does not divide the model's {heads} "
                           "attention heads: vLLM refuses it")


def kv_heads_per_rank(kv_heads: int, tensor_parallel_size: int) -> int:
    """vLLM shards KV heads over ranks and replicates them when there are more ranks than heads."""
    if kv_heads % tensor_parallel_size and tensor_parallel_size % kv_heads:
        raise HarnessError(
            f"tensor_parallel_size {tensor_parallel_size} neither divides nor is a multiple of {kv_heads} KV heads"
        )
    return max(1, kv_heads // tensor_parallel_size)


def layer_bytes_per_token(layer: LayerSpec, element_bytes: int, tensor_parallel_size: int) -> int:
    if layer.kind is LayerKind.MLA:  # one shared latent, replicated on every rank
        return layer.latent_dim * element_bytes
    if layer.kind is LayerKind.STATE:
        return 0
    return 2 * kv_heads_per_rank(layer.kv_heads, tensor_parallel_size) * layer.head_dim * element_bytes


def layer_state_bytes(
    layer: LayerSpec, model_element_bytes: int, tensor_parallel_size: int, speculative_tokens: int = 0
) -> int:
    """One sequence's state in one state layer, channels and heads split over ranks.

    The state follows the model's dtype, not the KV cache's (vLLM's mamba_cache_dtype 'auto'), and its
    conv window holds one more input per speculative token (gated_delta_net_state_shape and _dtype in
    vllm/model_executor/layers/mamba/mamba_utils.py at 02d71083).
    """
    conv = math.ceil(layer.conv_channels / tensor_parallel_size) * (layer.conv_width + speculative_tokens)
    ssm_bytes = KV_DTYPE_BYTES[layer.ssm_dtype] if layer.ssm_dtype else model_element_bytes
    return conv * model_element_bytes + math.ceil(layer.ssm_elements / tensor_parallel_size) * ssm_bytes
