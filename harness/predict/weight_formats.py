"""Bits per stored weight by checkpoint format, read from the checkpoint's own quantization config where it has one.

vLLM takes a checkpoint's format from config.json's `quantization_config` (`--quantization` may only name the
same method or its Marlin kernel), so the layout (bits, group size, zero points) and the modules left 16-bit
come from there; a flag without a config gets the format's usual layout below. Linear layers take the format's
bits; embeddings and vision towers stay in the model dtype (see `weights.weights_term`). A checkpoint whose
skip list spares a kind of decoder linear (attention, dense MLP, shared experts, routed experts) in every layer
leaves that kind 16-bit, as an MoE checkpoint that quantizes its routed experts alone does; one that spares a
kind in some layers and not others is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fnmatch import fnmatch
from typing import Any, NamedTuple

from pydantic import BaseModel

from harness.errors import HarnessError
from harness.predict.architectures import language_config
from harness.predict.parameter_count import ModelSize

# AWQ and GPTQ at their usual group of 128 (awq.py and gptq.py `create_weights`): 4-bit weights packed eight to an
# int32, one 4-bit zero point and one 16-bit scale per group of 128 inputs, 4 + 20 / 128 bits a weight (GPTQ's
# g_idx adds 32 bits per input row, under 0.01 bit a weight); MXFP4 one 8-bit scale per 32 weights. Bitsandbytes'
# 4-bit figure is an allowance (its block scales depend on the checkpoint's double quantisation).
# ModelOpt: `modelopt` is its FP8 (ModelOptFp8Config: 8-bit weights, per-tensor scales); `modelopt_fp4` its NVFP4,
# two 4-bit weights a byte and one FP8 scale per 16 inputs (modelopt.py ModelOptNvFp4LinearMethod
# `create_weights`), 4 + 8 / 16 bits a weight. vLLM resolves the flag `modelopt` to `modelopt_fp4` when the
# checkpoint's quant_algo is NVFP4. AutoRound's defaults are 4 bits, groups of 128, packed as GPTQ packs them.
GROUPED_4BIT = 4 + (4 + 16) / 128
NVFP4_BITS = 4 + 8 / 16
MXFP4_BITS = 4 + 8 / 32
QUANTIZED_BITS = {"fp8": 8.0, "int8": 8.0, "w8a8": 8.0, "mxfp4": MXFP4_BITS, "awq": GROUPED_4BIT,
                  "gptq": GROUPED_4BIT, "auto-round": GROUPED_4BIT, "bitsandbytes": 4.25, "4-bit": 4.25,
                  "modelopt": 8.0, "modelopt_fp4": NVFP4_BITS}
CONFIG_ONLY_FORMATS = frozenset({"compressed-tensors"})  # no usual layout: its config_groups say what it stores
MODELOPT_FORMATS = frozenset({"modelopt", "modelopt_fp4"})
EXPERTS_ONLY_FORMATS = frozenset({"mxfp4"})  # formats vLLM applies to the MoE experts alone
# The bits each integer format's kernels take, over the releases priced here: AWQ 4 (awq.py `AWQConfig`) and 8
# (awq_marlin.py `TYPE_MAP`); GPTQ 2, 3, 4 and 8 (gptq.py `GPTQConfig`; 0.34's auto_gptq.py keeps 4 and 8); AutoRound
# 2, 3, 4 and 8 (auto_round.py `SUPPORTED_BITS`).
KERNEL_BITS = {"awq": frozenset({4, 8}), "gptq": frozenset({2, 3, 4, 8}), "auto-round": frozenset({2, 3, 4, 8})}
# Other spellings of a method: the Marlin kernels vLLM swaps in for AWQ and GPTQ checkpoints hold the same
# weights (an engine config line names the kernel, `quantization=awq_marlin`); AutoRound's configs write
# `intel/auto-round` or `auto-round`.
ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq", "auto_round": "auto-round", "intel/auto-round": "auto-round",
           "compressed_tensors": "compressed-tensors"}
# (flag, checkpoint method) pairs vLLM accepts: the flag names the kernel or the variant the checkpoint is run with
# (an AutoRound checkpoint runs on the GPTQ or AWQ kernels, a ModelOpt one as its FP8 or NVFP4 variant).
KERNEL_OF_CHECKPOINT = frozenset({("gptq", "auto-round"), ("awq", "auto-round"), ("modelopt", "modelopt"),
                                  ("modelopt_fp4", "modelopt")})
# One module of each kind of decoder linear layer, as vLLM names them under the checkpoint's prefixes.
MIXER_LINEARS = ("self_attn.qkv_proj", "self_attn.q_proj", "self_attn.o_proj", "linear_attn.in_proj_qkvz",
                 "linear_attn.out_proj")
DENSE_LINEARS = ("mlp.gate_up_proj", "mlp.down_proj")
SHARED_LINEARS = ("mlp.shared_expert.gate_up_proj", "mlp.shared_experts.gate_up_proj")
ROUTED_LINEARS = ("mlp.experts",)
CLASS_LINEARS = {"mixer": MIXER_LINEARS, "dense": DENSE_LINEARS, "shared": SHARED_LINEARS, "routed": ROUTED_LINEARS}
CLASSES = tuple(CLASS_LINEARS)
DECODER_PREFIXES = ("model.layers", "model.language_model.layers", "language_model.model.layers")


class WeightFormat(BaseModel, frozen=True):
    """How a checkpoint stores its quantized weights: vLLM's method, bits per weight, and which weights."""

    method: str
    bits: float
    quantized: tuple[str, ...]  # the kinds of decoder linear stored at `bits` (CLASSES); the rest stay 16-bit
    source: str  # where the layout comes from


def weight_format(quantization: str | None, config: dict[str, Any], size: ModelSize,
                  source: str = "config.json") -> WeightFormat | None:
    """The format a start stores its weights in: the checkpoint's quantization_config, else the flag's usual one.
    `source` names the config file in a refusal."""
    stated = _quantization_config(config)
    flag = _method(quantization) if quantization else None
    if stated is None:
        return _flag_format(flag, quantization, size) if flag and quantization else None
    method = _stated_method(stated)
    if flag is not None and flag != method and (flag, method) not in KERNEL_OF_CHECKPOINT:
        raise HarnessError(f"--quantization {quantization}: {source} says quant_method "
                           f"'{stated.get('quant_method')}', and vLLM refuses a start whose two differ")
    try:
        return _stated_format(stated, method, size)
    except HarnessError as refusal:
        raise HarnessError(f"{source}: {refusal}") from None


def _stated_format(stated: dict[str, Any], method: str, size: ModelSize) -> WeightFormat:
    if not method:
        raise HarnessError("quantization_config names no quant_method")
    reader = LAYOUT_READERS.get(method)
    if reader is None:
        raise HarnessError(f"quantization_config: quant_method '{stated.get('quant_method')}' is not "
                           f"priced here (known: {', '.join(LAYOUT_READERS)})")
    layout = _aligned(reader(stated), size)
    return WeightFormat(method=layout.method, bits=layout.bits,
                        quantized=_quantized_classes(size, layout.method, layout.skips, layout.matches),
                        source=f"config.json quantization_config: {layout.detail}")


def check_quantization(quantization: str) -> None:
    """Refuse a --quantization this module cannot price, before any log or config is read."""
    if _method(quantization) not in {*QUANTIZED_BITS, *LAYOUT_READERS}:
        raise HarnessError(f"quantization '{quantization}' is not priced here (known: "
                           f"{', '.join(sorted({*QUANTIZED_BITS, *LAYOUT_READERS, *ALIASES}))})")


def held_in_model_dtype(quantization: str | None, config: dict[str, Any]) -> bool:
    """Whether every decoder linear is held in the model's dtype: no --quantization, no quantization_config."""
    return quantization is None and _quantization_config(config) is None


def checkpoint_kv_dtype(config: dict[str, Any]) -> str | None:
    """The cache's dtype under `--kv-cache-dtype auto` where the checkpoint sets it: FP8 for a compressed-tensors
    checkpoint that states a kv_cache_scheme, which vLLM's Attention layer turns into cache_dtype "fp8"
    ("llm-compressor mdls need to set cache_dtype to "fp8" manually", attention/layer.py; FlashInfer then logs
    `kv_cache_dtype=torch.float8_e4m3fn`); None where the model's dtype holds."""
    stated = _quantization_config(config)
    if stated is not None and _stated_method(stated) == "compressed-tensors" \
            and isinstance(stated.get("kv_cache_scheme"), dict):
        return "fp8"
    return None


def _aligned(layout: Layout, size: ModelSize) -> Layout:
    """A stated group must divide the hidden size, the input every layer's first projections take whole: vLLM's
    `create_weights` refuses the checkpoint otherwise (awq.py, gptq.py, marlin_utils.py)."""
    if layout.group > 0 and size.hidden % layout.group:
        raise HarnessError(f"quantization_config: groups of {layout.group} inputs do not divide the "
                           f"hidden size {size.hidden}; vLLM refuses such a checkpoint ('The input size is not "
                           "aligned with the quantized weight shape')")
    return layout


def _flag_format(method: str, quantization: str, size: ModelSize) -> WeightFormat:
    if method in MODELOPT_FORMATS:
        raise HarnessError(f"quantization '{quantization}': which layers stay 16-bit is the checkpoint's own list; "
                           "give the quantized checkpoint's config.json (its quantization_config names them)")
    if method in CONFIG_ONLY_FORMATS:
        raise HarnessError(f"quantization '{quantization}': its bits and groups are the checkpoint's own; give the "
                           "quantized checkpoint's config.json (its quantization_config states them)")
    if method not in QUANTIZED_BITS:
        raise HarnessError(f"quantization '{quantization}' is not priced here (known: "
                           f"{', '.join([*QUANTIZED_BITS, *CONFIG_ONLY_FORMATS])})")
    others = sorted(KERNEL_BITS.get(method, frozenset()) - {4})
    return WeightFormat(method=method, bits=QUANTIZED_BITS[method],
                        quantized=_quantized_classes(size, method, [], _substring),
                        source=f"--quantization {quantization}, the format's usual layout"
                        + (f" (4-bit; its kernels also take {'/'.join(map(str, others))}-bit checkpoints, priced "
                           "from their own config.json)" if others else ""))


def _method(name: str) -> str:
    key = name.strip().lower()
    return ALIASES.get(key, key)


def _stated_method(stated: dict[str, Any]) -> str:
    """The config's quant_method; ModelOpt's hf_quant_config.json form names none, only its nested quant_algo."""
    if not stated.get("quant_method") and isinstance(stated.get("quantization"), dict):
        return "modelopt"
    return _method(str(stated.get("quant_method") or ""))


def _quantization_config(config: dict[str, Any]) -> dict[str, Any] | None:
    for holder in (config, language_config(config)):
        stated = holder.get("quantization_config")
        if isinstance(stated, dict):
            return stated
    return None


Matcher = Callable[[str, str], bool]


class Layout(NamedTuple):
    """What a quantization_config states: vLLM's method, bits a weight, the modules left 16-bit and how its skip
    list matches them, and the group of inputs a scale covers (0: no groups)."""

    method: str
    bits: float
    detail: str
    skips: list[str]
    matches: Matcher
    group: int = 0


def _substring(module: str, pattern: str) -> bool:
    """AWQ's, FP8's and AutoRound's test: the listed name is part of the module's (awq.py `is_layer_skipped_awq`)."""
    return pattern in module


def _modelopt_match(module: str, pattern: str) -> bool:
    """ModelOpt's test: the pattern is the module, inside its name, or a wildcard matching it."""
    return pattern in module or fnmatch(module, pattern)


def _compressed_tensors_match(module: str, pattern: str) -> bool:
    """compressed-tensors' test: `re:` patterns match from the name's start, other targets are whole names."""
    return re.match(pattern[3:], module) is not None if pattern.startswith("re:") else module == pattern


def _grouped_bits(bits: float, group: int, zero_points: bool) -> float:
    """Packed integer weights, a 16-bit scale per group and, when asymmetric, a packed zero point per group."""
    if group <= 0:  # one group per output channel: a scale per row, under 0.01 bit a weight
        return bits
    return bits + (16 + (bits if zero_points else 0)) / group


def _whole(holder: dict[str, Any], keys: tuple[str, ...], default: int, lowest: int, highest: int) -> int:
    """The first of the fields present, a whole number in [lowest, highest]; the field is named if it is not."""
    key = next((key for key in keys if holder.get(key) is not None), None)
    if key is None:
        return default
    value = holder[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= highest:
        raise HarnessError(f"quantization_config: field '{key}' must be a whole number from {lowest} "
                           f"to {highest}, got {value!r}")
    return value


def _bits(holder: dict[str, Any], *keys: str) -> int:
    return _whole(holder, keys, 4, 1, 16)


def _kernel_bits(holder: dict[str, Any], method: str, keys: tuple[str, ...]) -> int:
    """The stated bits, where some release's kernels for the method take them (KERNEL_BITS)."""
    bits = _bits(holder, *keys)
    if bits not in KERNEL_BITS[method]:
        taken = ", ".join(str(width) for width in sorted(KERNEL_BITS[method]))
        raise HarnessError(f"quantization_config: {method} at {bits} bits is refused by vLLM, whose "
                           f"{method} kernels take {taken} bits")
    return bits


def _group(holder: dict[str, Any], *keys: str) -> int:
    return _whole(holder, keys, 128, -1, 1 << 20)  # -1 (GPTQ) or 0: one group per output channel


def _names(holder: dict[str, Any], key: str) -> list[str]:
    """A list of module names or patterns; a lone string is one name."""
    value = holder.get(key)
    if isinstance(value, str):
        return [value]
    return [str(name) for name in value] if isinstance(value, list) else []


def _gptq_layout(stated: dict[str, Any]) -> Layout:
    bits, group = _kernel_bits(stated, "gptq", ("bits",)), _group(stated, "group_size")
    # gptq.py `create_weights` keeps qzeros whether or not the checkpoint is symmetric
    return Layout("gptq", _grouped_bits(bits, group, True), f"gptq, {bits} bits, groups of {group}", [], _substring,
                  group)


def _awq_layout(stated: dict[str, Any]) -> Layout:
    bits, group = _kernel_bits(stated, "awq", ("bits", "w_bit")), _group(stated, "group_size", "q_group_size")
    return Layout("awq", _grouped_bits(bits, group, True), f"awq, {bits} bits, groups of {group}",
                  _names(stated, "modules_to_not_convert"), _substring, group)


def _auto_round_layout(stated: dict[str, Any]) -> Layout:
    bits, group = _kernel_bits(stated, "auto-round", ("bits",)), _group(stated, "group_size")
    extra = stated.get("extra_config")
    extra = extra if isinstance(extra, dict) else {}
    skips = [name for name, layer in extra.items()
             if isinstance(layer, dict) and isinstance(layer.get("bits"), int | float) and layer["bits"] >= 16]
    return Layout("auto-round", _grouped_bits(bits, group, True), f"auto-round, {bits} bits, groups of {group}",
                  skips, _substring, group)


def _fp8_layout(stated: dict[str, Any]) -> Layout:
    skips = _names(stated, "ignored_layers") or _names(stated, "modules_to_not_convert")
    return Layout("fp8", 8.0, "fp8, 8 bits", skips, _substring)


def _mxfp4_layout(stated: dict[str, Any]) -> Layout:
    return Layout("mxfp4", MXFP4_BITS, "mxfp4 experts, 4 bits and a scale byte per 32", [], _substring)


def _bitsandbytes_layout(stated: dict[str, Any]) -> Layout:
    bits = 8.0 if stated.get("load_in_8bit") is True else QUANTIZED_BITS["bitsandbytes"]
    return Layout("bitsandbytes", bits, f"bitsandbytes, {bits:g} bits", _names(stated, "llm_int8_skip_modules"),
                  _substring)


def _modelopt_layout(stated: dict[str, Any]) -> Layout:
    nested = stated.get("quantization")  # hf_quant_config.json's form
    holder = nested if isinstance(nested, dict) else stated
    algo = str(holder.get("quant_algo") or "FP8").upper()
    method = "modelopt_fp4" if "FP4" in algo else "modelopt"
    skips = _names(holder, "exclude_modules") if isinstance(nested, dict) else _names(stated, "ignore")
    return Layout(method, QUANTIZED_BITS[method], f"modelopt {algo}", skips or _names(stated, "exclude_modules"),
                  _modelopt_match)


def _compressed_tensors_layout(stated: dict[str, Any]) -> Layout:
    """compressed-tensors' one weight scheme (compressed_tensors_wNa16.py, _w8a8 and _w4a4_nvfp4 `create_weights`)."""
    groups = stated.get("config_groups")
    schemes = {str(group.get("format") or stated.get("format")): group.get("weights")
               for group in (groups.values() if isinstance(groups, dict) else []) if isinstance(group, dict)}
    if len(schemes) != 1:
        raise HarnessError("quantization_config: compressed-tensors with "
                           f"{len(schemes) or 'no'} weight schemes; only one is priced here")
    fmt, weights = next(iter(schemes.items()))
    weights = weights if isinstance(weights, dict) else {}
    bits: float = _whole(weights, ("num_bits",), 8, 1, 16)
    group = 0
    if fmt.startswith("nvfp4"):
        bits, detail = NVFP4_BITS, "nvfp4, 4 bits and an FP8 scale per 16"
    elif fmt.startswith("mxfp4"):
        bits, detail = MXFP4_BITS, "mxfp4, 4 bits and a scale byte per 32"
    elif weights.get("strategy") == "group":
        group = _group(weights, "group_size")
        symmetric = weights.get("symmetric", True) is not False
        detail = f"{fmt}, {bits:g} bits, groups of {group}, {'symmetric' if symmetric else 'zero points'}"
        bits = _grouped_bits(bits, group, not symmetric)
    else:
        detail = f"{fmt}, {bits:g} bits per {weights.get('strategy') or 'tensor'}"
    skips = _names(stated, "ignore")
    for pattern in skips:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as error:
                raise HarnessError(f"quantization_config: ignore pattern '{pattern}' is not a regular "
                                   f"expression ({error})") from None
    return Layout("compressed-tensors", bits, detail, skips, _compressed_tensors_match, group)


LAYOUT_READERS: dict[str, Callable[[dict[str, Any]], Layout]] = {
    "gptq": _gptq_layout, "awq": _awq_layout, "auto-round": _auto_round_layout, "fp8": _fp8_layout,
    "mxfp4": _mxfp4_layout, "bitsandbytes": _bitsandbytes_layout, "modelopt": _modelopt_layout,
    "compressed-tensors": _compressed_tensors_layout,
}


def _quantized_classes(size: ModelSize, method: str, skips: list[str], matches: Matcher) -> tuple[str, ...]:
    """The kinds of decoder linear the format quantizes: those whose every layer the skip list leaves alone. A kind
    spared in some of its layers but not in others is refused by pattern."""
    dense_layers = size.layers - size.moe_layers
    spans = {"mixer": range(size.layers), "dense": range(dense_layers)}
    if size.moe_layers:
        spans["routed"] = range(dense_layers, size.layers)
        if size.shared_experts:
            spans["shared"] = spans["routed"]
    spans = {kind: layers for kind, layers in spans.items() if layers}
    if method in EXPERTS_ONLY_FORMATS:
        return ("routed",) if "routed" in spans else ()
    spared = {kind: [layer for layer in layers if _patterns(skips, CLASS_LINEARS[kind], layer, matches)]
              for kind, layers in spans.items()}
    partial = [kind for kind, layers in spared.items() if 0 < len(layers) < len(spans[kind])]
    if partial:
        named = sorted({pattern for kind in partial for layer in spared[kind]
                        for pattern in _patterns(skips, CLASS_LINEARS[kind], layer, matches)})
        raise HarnessError(f"quantization '{method}': the checkpoint keeps some decoder layers 16-bit "
                           f"({', '.join(named[:3])}{' …' if len(named) > 3 else ''}); not priced here")
    return tuple(kind for kind in CLASSES if kind in spans and not spared[kind])


def _patterns(skips: list[str], modules: tuple[str, ...], layer: int, matches: Matcher) -> list[str]:
    """The skip patterns that reach one of these modules of this layer, under any of the checkpoint's prefixes."""
    probes = [f"{prefix}.{layer}.{module}" for prefix in DECODER_PREFIXES for module in modules]
    return [pattern for pattern in skips if any(matches(probe, pattern) for probe in probes)]
