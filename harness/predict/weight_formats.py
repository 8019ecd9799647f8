"""Bits per stored weight by checkpoint format, and whether a checkpoint's own skip list leaves that true.

Linear layers take the format's bits; embeddings and vision towers stay in the model dtype (see
`weights.weights_term`). A ModelOpt checkpoint names the modules it left 16-bit in its quantization
config (`ignore` in config.json's `quantization_config`, `exclude_modules` in hf_quant_config.json); vLLM
honours that list (modelopt.py `ModelOptQuantConfigBase.is_layer_excluded`), so its weights can be priced
only when the list is known, and here only when it spares no decoder linear layer.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

from harness.errors import HarnessError
from harness.predict.parameter_count import ModelSize

# Formats vLLM applies to the MoE experts alone: attention, router and embeddings stay in the model dtype.
EXPERTS_ONLY_FORMATS = frozenset({"mxfp4"})
# AWQ and GPTQ at their usual group of 128 (awq.py and gptq.py `create_weights`): 4-bit weights packed eight to an
# int32, one 4-bit zero point and one 16-bit scale per group of 128 inputs, 4 + 20 / 128 bits a weight (GPTQ's
# g_idx adds 32 bits per input row, under 0.01 bit a weight); MXFP4 one 8-bit scale per 32 weights. Bitsandbytes'
# 4-bit figure is an allowance (its block scales depend on the checkpoint's double quantisation).
# ModelOpt: `modelopt` is its FP8 (ModelOptFp8Config: 8-bit weights, per-tensor scales); `modelopt_fp4` its NVFP4,
# two 4-bit weights a byte and one FP8 scale per 16 inputs (modelopt.py ModelOptNvFp4LinearMethod
# `create_weights`), 4 + 8 / 16 bits a weight. vLLM resolves the flag `modelopt` to `modelopt_fp4` when the
# checkpoint's quant_algo is NVFP4, so a case names the format its checkpoint holds.
GROUPED_4BIT = 4 + (4 + 16) / 128
NVFP4_BITS = 4 + 8 / 16
QUANTIZED_BITS = {"fp8": 8.0, "int8": 8.0, "w8a8": 8.0, "mxfp4": 4.25, "awq": GROUPED_4BIT, "gptq": GROUPED_4BIT,
                  "bitsandbytes": 4.25, "4-bit": 4.25, "modelopt": 8.0, "modelopt_fp4": NVFP4_BITS}
MODELOPT_FORMATS = frozenset({"modelopt", "modelopt_fp4"})
# The Marlin kernels vLLM swaps in for AWQ and GPTQ checkpoints hold the same weights; an engine config line
# names the kernel (`quantization=awq_marlin`).
KERNEL_ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq"}
# One module of each kind of decoder linear layer, as vLLM names them under the checkpoint's prefixes; a skip
# pattern that reaches any of them keeps some of the decoder 16-bit. Routers (`mlp.gate`) are too small to matter.
MIXER_LINEARS = ("self_attn.qkv_proj", "self_attn.q_proj", "self_attn.o_proj", "linear_attn.in_proj_qkvz",
                 "linear_attn.out_proj")
DENSE_LINEARS = ("mlp.gate_up_proj", "mlp.down_proj")
MOE_LINEARS = ("mlp.experts", "mlp.shared_expert.gate_up_proj", "mlp.shared_experts.gate_up_proj")
DECODER_PREFIXES = ("model.layers", "model.language_model.layers", "language_model.model.layers")


def format_bits(quantization: str) -> tuple[str, float]:
    """(vLLM's method name, bits per stored linear weight) for a --quantization value."""
    key = quantization.lower().split()[0]
    key = KERNEL_ALIASES.get(key, key)
    if key not in QUANTIZED_BITS:
        raise HarnessError(f"quantization '{quantization}' is not priced here (known: {', '.join(QUANTIZED_BITS)})")
    return key, QUANTIZED_BITS[key]


def check_modelopt_skips(config: dict[str, Any], size: ModelSize, method: str) -> None:
    """Refuse a ModelOpt checkpoint whose skip list is unknown or keeps decoder linears 16-bit."""
    skips = _modelopt_skip_list(config)
    if skips is None:
        raise HarnessError(f"quantization '{method}': which layers stay 16-bit is the checkpoint's own list; give "
                           "the quantized checkpoint's config.json (its quantization_config names them)")
    modules = MIXER_LINEARS + (MOE_LINEARS if size.moe_layers else ()) \
        + (DENSE_LINEARS if size.moe_layers < size.layers else ())
    probes = [f"{prefix}.{layer}.{module}" for prefix in DECODER_PREFIXES for layer in range(size.layers)
              for module in modules]
    sparing = [pattern for pattern in skips if any(_skipped(probe, pattern) for probe in probes)]
    if sparing:
        raise HarnessError(f"quantization '{method}': the checkpoint keeps decoder layers 16-bit "
                           f"({', '.join(sparing[:3])}{' …' if len(sparing) > 3 else ''}); not priced here")


def _modelopt_skip_list(config: dict[str, Any]) -> list[str] | None:
    quantization = config.get("quantization_config")
    if not isinstance(quantization, dict):
        return None
    nested = quantization.get("quantization")  # hf_quant_config.json's form
    skips = nested.get("exclude_modules") if isinstance(nested, dict) else quantization.get("ignore")
    if skips is None:
        skips = quantization.get("exclude_modules")
    return [str(pattern) for pattern in skips] if isinstance(skips, list) else None


def _skipped(module: str, pattern: str) -> bool:
    """vLLM's test: the pattern is the module, inside its name, or a wildcard matching it."""
    return pattern in module or fnmatch(module, pattern)
