"""The memory-profiling lines a start prints (0.6's pairs and table, V0's three lines, V1's breakdown), and
the terms they state — weights, activation peak, non-torch and CUDA-graph memory — in bytes."""

from __future__ import annotations

import re
from typing import Any

import pydantic
from packaging.version import InvalidVersion, Version

from harness.observe.log_lines import LOGGED_NUMBER, Fraction
from harness.predict.releases import GRAPHS_RESERVED_SINCE
from harness.units import gib_to_bytes, logged_figure

# DEBUG breakdown, 0.11+: `Memory profiling takes 1.2 seconds. Total non KV cache memory: 9.1GiB; …`
PROFILE_V1 = re.compile(r"^Memory profiling takes (?P<seconds>\d+(?:\.\d+)?) seconds\. (?P<parts>.*)$")
# 0.7-0.8 V0 (INFO, three lines): `Memory profiling takes 2.7 seconds`, `the current vLLM instance …`,
# `model weights take 0.52GiB; …; the rest of the memory reserved for KV Cache is 16.09GiB.`
PROFILE_V0_START = re.compile(r"^Memory profiling takes (?P<seconds>\d+(?:\.\d+)?) seconds$")
PROFILE_V0_BUDGET = re.compile(
    rf"total_gpu_memory \((?P<total>{LOGGED_NUMBER})GiB\) x gpu_memory_utilization \((?P<util>\d+(?:\.\d+)?)\)"
)
PROFILE_V0_PARTS = re.compile(r"^model weights take .*GiB")
V0_KV_REST = re.compile(rf"reserved for KV Cache is (?P<gib>{LOGGED_NUMBER})\s*GiB")
# 0.6: `Memory profiling results: total_gpu_memory=139.80GiB … kv_cache_size=122.71GiB gpu_memory_utilization=0.90`
PROFILE_V06 = re.compile(r"^Memory profiling results: (?P<pairs>.*)$")
# 0.6.5 development builds print the same figures as a table, one per line, after "Memory profiling results:".
PROFILE_TABLE_ROW = re.compile(
    rf"^(?P<label>total_gpu_memory|model weights take|non_torch_memory|PyTorch activation peak memory|"
    rf"available_kv_cache_memory)\s+(?P<gib>{LOGGED_NUMBER})GiB$"
)
TABLE_KEYS = {"total_gpu_memory": "total_gpu_memory_bytes", "model weights take": "model_weights_bytes",
              "non_torch_memory": "non_torch_memory_bytes",
              "PyTorch activation peak memory": "pytorch_activation_peak_memory_bytes",
              "available_kv_cache_memory": "kv_cache_size_bytes"}
# 0.10.2+, after the cache is built (gpu_worker.py `compile_or_warm_up_model`): `Free memory on device (78.57/79.18
# GiB) on startup. Desired GPU memory utilization is (0.9, 71.26 GiB). Actual usage is 56.93 GiB for weight, 5.58
# GiB for peak activation, 0.07 GiB for non-torch memory, and 0.69 GiB for CUDAGraph memory. Replace …`; from 0.30
# `… Actual usage is 2.18 GiB for consumed memory (weights + non-torch), 0.15 GiB for peak activation, and 0.0 GiB
# for CUDAGraph memory. …`; an excerpt may end the line at the usage's full stop
USAGE_V1 = re.compile(
    rf"^Free memory on device \({LOGGED_NUMBER}/(?P<total>{LOGGED_NUMBER}) GiB\) on startup\. Desired GPU memory "
    rf"utilization is \((?P<util>\d+(?:\.\d+)?), {LOGGED_NUMBER} GiB\)\. Actual usage is (?P<parts>.*?)\."
    r"(?: Replace|\s*$)"
)
# The same line's close, from 0.11: `… Current kv cache memory in use is 12.26 GiB.` (available_kv_cache_memory_bytes)
KV_IN_USE = re.compile(rf"Current kv cache memory in use is (?P<gib>{LOGGED_NUMBER}) GiB")
# 0.21+, beside "Available KV cache memory" (gpu_worker.py `determine_available_memory`): `CUDA graph memory profiling
# is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.9764 is equivalent to …`, or with
# VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 `… is disabled … increasing --gpu-memory-utilization from 0.9000 to …`
GRAPH_PROFILING = re.compile(
    r"^CUDA graph memory profiling is (?P<state>enabled|disabled)\b.*?--gpu-memory-utilization(?:=| from )"
    r"(?P<util>\d+(?:\.\d+)?)"
)
# 0.21+ (gpu_model_runner.py `profile_cudagraph_memory`): `Estimated CUDA graph memory: 0.52 GiB total`, the figure
# subtracted before the cache while that profiling is enabled
GRAPH_ESTIMATE = re.compile(rf"^Estimated CUDA graph memory: (?P<gib>{LOGGED_NUMBER}) GiB total")
USAGE_PART = re.compile(rf"(?:and )?(?P<gib>{LOGGED_NUMBER}) GiB for (?P<label>[^,]+?)$")
USAGE_KEYS = {"weight": "model_weights_bytes", "peak activation": "pytorch_activation_peak_memory_bytes",
              "non-torch memory": "non_torch_memory_bytes", "CUDAGraph memory": "cuda_graph_memory_bytes",
              "consumed memory (weights + non-torch)": "consumed_memory_bytes"}
GIB_PART = re.compile(rf"^(?P<label>.+?)(?::| takes| take| is)\s*(?P<gib>{LOGGED_NUMBER})\s*GiB\.?$")
KEY_VALUE = re.compile(rf"(?P<key>\w+)=(?P<value>{LOGGED_NUMBER})(?P<unit>Gi[Bb])?")
TERM_LOG_KEYS = {
    "weights": ("model_weights_bytes",),
    "activation_peak": ("pytorch_activation_peak_memory_bytes", "torch_peak_increase_bytes"),
    "non_torch": ("non_torch_memory_bytes", "non_torch_forward_increase_memory_bytes"),
}


class MemoryProfile(pydantic.BaseModel):
    """The engine's memory-profiling breakdown, each figure keyed by its logged label (checked as each is read)."""

    model_config = pydantic.ConfigDict(validate_assignment=True)

    profiling_seconds: float | None = None
    gpu_memory_utilization: Fraction | None = None
    components_bytes: dict[str, int] = {}
    kv_cache_bytes: int | None = None  # what this rank's profile left for the cache, where the format states it
    graph_memory_profiled: bool | None = None  # 0.21+: whether the CUDA-graph estimate was reserved before the cache


def memory_profile_line(message: str, profile: MemoryProfile | None) -> MemoryProfile | None:
    """Fold one of the memory-profiling formats into the running breakdown of the process that printed it."""
    return (_fold_v1_line(message, profile) or _fold_v0_line(message, profile)
            or _fold_table_line(message, profile) or profile)


def _fold_v1_line(message: str, profile: MemoryProfile | None) -> MemoryProfile | None:
    """V1's one-line summary, its usage line after the cache and the CUDA-graph estimate; None when none."""
    if match := PROFILE_V1.search(message):
        profile = profile or MemoryProfile()
        profile.profiling_seconds = logged_figure(match.group("seconds"))
        profile.components_bytes.update(_gib_parts(match.group("parts")))
    elif match := USAGE_V1.search(message):
        profile = profile or MemoryProfile()
        profile.gpu_memory_utilization = logged_figure(match.group("util"))
        profile.components_bytes["total_gpu_memory_bytes"] = gib_to_bytes(match.group("total"))
        for part in match.group("parts").split(", "):
            if (usage := USAGE_PART.search(part.strip())) and (key := USAGE_KEYS.get(usage.group("label"))):
                profile.components_bytes[key] = gib_to_bytes(usage.group("gib"))
        if in_use := KV_IN_USE.search(message):
            profile.kv_cache_bytes = gib_to_bytes(in_use.group("gib"))
    elif match := GRAPH_PROFILING.search(message):
        profile = profile or MemoryProfile()
        profile.gpu_memory_utilization = logged_figure(match.group("util"))
        profile.graph_memory_profiled = match.group("state") == "enabled"
    elif match := GRAPH_ESTIMATE.search(message):
        profile = profile or MemoryProfile()
        profile.components_bytes["cuda_graph_estimate_bytes"] = gib_to_bytes(match.group("gib"))
    else:
        return None
    return profile


def _fold_v0_line(message: str, profile: MemoryProfile | None) -> MemoryProfile | None:
    """V0's three lines: the profile's duration, the budget, and the parts; None when the line is none of them."""
    if match := PROFILE_V0_START.search(message):
        profile = profile or MemoryProfile()
        profile.profiling_seconds = logged_figure(match.group("seconds"))
    elif match := PROFILE_V0_BUDGET.search(message):
        profile = profile or MemoryProfile()
        profile.gpu_memory_utilization = logged_figure(match.group("util"))
        profile.components_bytes["total_gpu_memory_bytes"] = gib_to_bytes(match.group("total"))
    elif PROFILE_V0_PARTS.search(message):
        profile = profile or MemoryProfile()
        profile.components_bytes.update(_gib_parts(message))
        if rest := V0_KV_REST.search(message):
            profile.kv_cache_bytes = gib_to_bytes(rest.group("gib"))
    else:
        return None
    return profile


def _fold_table_line(message: str, profile: MemoryProfile | None) -> MemoryProfile | None:
    """A row of the profiling table, or 0.6's key=value line; None when the line is neither."""
    if match := PROFILE_TABLE_ROW.search(message):
        profile = profile or MemoryProfile()
        key = TABLE_KEYS[match.group("label")]
        profile.components_bytes[key] = gib_to_bytes(match.group("gib"))
        if key == "kv_cache_size_bytes":
            profile.kv_cache_bytes = profile.components_bytes[key]
        return profile
    if match := PROFILE_V06.search(message):
        profile = profile or MemoryProfile()
        for pair in KEY_VALUE.finditer(match.group("pairs")):
            if pair.group("unit"):
                profile.components_bytes[f"{pair.group('key')}_bytes"] = gib_to_bytes(pair.group("value"))
            elif pair.group("key") == "gpu_memory_utilization":
                profile.gpu_memory_utilization = logged_figure(pair.group("value"))
        profile.kv_cache_bytes = profile.components_bytes.get("kv_cache_size_bytes", profile.kv_cache_bytes)
        return profile
    return None


def _gib_parts(text: str) -> dict[str, int]:
    parts: dict[str, int] = {}
    for part in text.split(";"):
        if match := GIB_PART.search(part.strip()):
            parts[f"{_snake(match.group('label'))}_bytes"] = gib_to_bytes(match.group("gib"))
    return parts


def logged_term_bytes(log: Any) -> dict[str, int]:
    """The terms a log states: weights, activation and non-torch from the profile, graphs from capture."""
    parts = log.memory_profile.components_bytes if log.memory_profile else {}
    found: dict[str, int] = {}
    for term, keys in TERM_LOG_KEYS.items():
        for key in keys:
            if key in parts:
                found[term] = parts[key]
                break
    weights = parts.get("model_weights_bytes") or log.model_weights_bytes
    if "activation_peak" not in found and "peak_torch_memory_bytes" in parts and weights:
        found["activation_peak"] = parts["peak_torch_memory_bytes"] - weights  # 0.6 logs the peak with weights
    if "weights" not in found and log.model_weights_bytes:
        found["weights"] = log.model_weights_bytes
    if "non_torch" not in found and "consumed_memory_bytes" in parts and "weights" in found:
        found["non_torch"] = parts["consumed_memory_bytes"] - found["weights"]  # 0.30 logs the two together
    if (graphs := _graph_bytes(log, parts)) is not None:
        found["cuda_graphs"] = graphs
    return found


def _graph_bytes(log: Any, parts: dict[str, int]) -> int | None:
    """The CUDA-graph memory the release accounts: from 0.21 the estimate the cache is sized without (0.19 and 0.20
    print it too, but capture after the cache), else, or where the excerpt lacks it, what the capture took."""
    estimate = parts.get("cuda_graph_estimate_bytes")
    if estimate is not None and _graphs_reserved(log.engine_version):
        return estimate
    return log.cuda_graph_bytes if log.cuda_graph_bytes is not None else parts.get("cuda_graph_memory_bytes")


def _graphs_reserved(engine_version: str | None) -> bool:
    try:
        return engine_version is not None and Version(engine_version) >= GRAPHS_RESERVED_SINCE
    except InvalidVersion:  # a log naming its release `dev`
        return False


def _snake(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
