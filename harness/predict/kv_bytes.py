"""Bytes one layer's KV cache takes, per token or per sequence, on one tensor-parallel rank.

The unit both budget directions build on: the forward budget multiplies it by a population, the
capacity prediction divides an available-memory figure by it.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from packaging.version import Version

from harness.errors import HarnessError
from harness.predict.architectures import language_config
from harness.predict.model_shape import LayerKind, LayerSpec

KV_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}
KV_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "fp32": "float32"}


class KvFormat(NamedTuple):
    """How the cache stores one token's K (or V) of one head: whole elements, or quantized values with their scales."""

    name: str
    element_bytes: int  # bytes per stored element: the dtype's, one for the scaled formats
    values_per_byte: int = 1  # int4 and FP4 pack two values a byte
    scale_bytes: int = 0  # a float32 scale per token and head (the per-token-head formats)
    values_per_block_scale: int = 0  # NVFP4: one FP8 scale per 16 values
    since: Version | None = None  # the release that added it

    def head_bytes(self, head_dim: int) -> int:
        block_scales = head_dim // self.values_per_block_scale if self.values_per_block_scale else 0
        return head_dim * self.element_bytes // self.values_per_byte + block_scales + self.scale_bytes

    @property
    def scaled(self) -> bool:
        """Values stored beside their scales (and, for int4 and FP4, two to a byte)."""
        return self.scale_bytes > 0 or self.values_per_block_scale > 0


# The quantized caches of 0.20 on (vllm/v1/kv_cache_interface.py `AttentionSpec.page_size_bytes` 0.20-0.29, the
# Triton and FlashInfer backends' `customize_spec` from 0.30, read to 0.34): per-token-head int8 and FP8 keep each
# head's values and a float32 scale; int4 packs two values a byte (0.25 on); NVFP4 packs two FP4 values a byte and
# an FP8 scale per 16 (0.21 on). vLLM's TurboQuant caches are not priced.
SCALED_KV_FORMATS = {
    "int8_per_token_head": KvFormat("int8_per_token_head", 1, scale_bytes=4, since=Version("0.20")),
    "fp8_per_token_head": KvFormat("fp8_per_token_head", 1, scale_bytes=4, since=Version("0.20")),
    "int4_per_token_head": KvFormat("int4_per_token_head", 1, values_per_byte=2, scale_bytes=4,
                                    since=Version("0.25")),
    "nvfp4": KvFormat("nvfp4", 1, values_per_byte=2, values_per_block_scale=16, since=Version("0.21")),
}


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: str) -> tuple[str, int]:
    """vLLM's --kv-cache-dtype name → (dtype, bytes per element); 'auto' follows the model."""
    name = model_dtype if kv_cache_dtype.lower() == "auto" else kv_cache_dtype.lower()
    name = KV_DTYPE_ALIASES.get(name, name)
    if name in SCALED_KV_FORMATS:
        return name, SCALED_KV_FORMATS[name].element_bytes
    if name not in KV_DTYPE_BYTES:
        choices = ", ".join(["auto", *KV_DTYPE_ALIASES, *KV_DTYPE_BYTES, *SCALED_KV_FORMATS])
        raise HarnessError(f"unknown kv cache dtype '{kv_cache_dtype}' (choose from {choices})")
    return name, KV_DTYPE_BYTES[name]


def kv_format(kv_cache_dtype: str, model_dtype: str, engine_version: Version) -> KvFormat:
    """The cache's storage for a --kv-cache-dtype under a release; a scaled format the release lacks is refused."""
    name, element = resolve_kv_dtype(kv_cache_dtype, model_dtype)
    scaled = SCALED_KV_FORMATS.get(name)
    if scaled is None:
        return KvFormat(name, element)
    if scaled.since is not None and engine_version < scaled.since:
        raise HarnessError(f"kv cache dtype '{name}' arrived in vLLM {scaled.since}; the release priced is "
                           f"{engine_version} (give --engine-version)")
    return scaled


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


def layer_bytes_per_token(layer: LayerSpec, cache: KvFormat, tensor_parallel_size: int) -> int:
    if layer.kind is LayerKind.MLA:  # one shared latent, replicated on every rank
        if cache.scaled:
            raise HarnessError(f"kv cache dtype '{cache.name}' for MLA's latent cache is not modelled")
        return layer.latent_dim * cache.element_bytes
    if layer.kind is LayerKind.STATE:
        return 0
    return 2 * kv_heads_per_rank(layer.kv_heads, tensor_parallel_size) * cache.head_bytes(layer.head_dim)


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
