"""Which vLLM release's rules apply: the calculator follows each release's sizing and log arithmetic.

A release is given as a version string (from a log, a flag or the pinned image); before the oldest release
with rules it is refused, after the newest one checked it is priced by that one's rules, with a warning.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from harness.errors import HarnessError

PRODUCTION_ENGINE = "0.11.2"  # the pinned image; its log and grouping rules are the default
OLDEST_RULES = Version("0.6")  # the oldest release whose sizing and log rules the calculator follows
NEWEST_CHECKED = Version("0.33.99")  # releases after this are priced by 0.33's rules, with a warning
# Logged tokens = int(max concurrency × max_model_len) from here on (vllm-project/vllm#40691: the old
# blocks // groups × block size misstated hybrids); the corpus's 0.20.1rc1.dev16 log still prints the old figure.
DERIVED_TOKENS_SINCE = Version("0.20.1")
UNIFIED_PAGES_SINCE = Version("0.12")  # hybrid attention layers of unequal pages: smaller pages take larger blocks
WIDE_GROUP_PADDING_SINCE = Version("0.32")  # hybrid groups pad up to the most layers under 1.5× the fewest (1.25×)
# "CUDA graph memory profiling is enabled (default since v0.21.0)": the estimate is reserved before the cache
GRAPHS_RESERVED_SINCE = Version("0.21")
V1_DEFAULT_SINCE = Version("0.8")  # the V1 engine is the default from here on
V1_FIRST = Version("0.7")  # VLLM_USE_V1=1 runs V1 from 0.7.0 on
V0_REMOVED_IN = Version("0.11")  # 0.11.0's wheel has no V0 worker (vllm/worker/worker.py)
# `--gpu-memory-utilization` when a launch leaves it out: config/cache.py's default is 0.9 through 0.19.1 and 0.92
# from 0.20.0 (read in 0.20.0, 0.22.0 … 0.31.0 and 0.33.0).
HIGHER_UTILIZATION_SINCE = Version("0.20")
# From 0.34 the cache is, by default on CUDA, an extensible one sized after warmup and CUDA-graph capture from the
# memory then free, with --gpu-memory-utilization unset taken as 1.0 and a margin of at least 1 GiB beside the
# measured peak (config/cache.py `resolved_gpu_memory_utilization`, v1/worker/extensible_kv_cache.py
# `measure_kv_cache_bytes`, read in 0.34.0): not the profile these rules follow.
EXTENSIBLE_CACHE_SINCE = Version("0.34")
EXTENSIBLE_CACHE_NOTE = ("from 0.34 vLLM sizes the cache after warmup from the memory then free (the extensible KV "
                         "cache, default on CUDA; an unset --gpu-memory-utilization is 1.0 there), which these rules "
                         "do not follow: the figure may be several GiB off")


def release_version(engine_version: str) -> Version:
    """A version string as a release; a log can name its release `dev` (vLLM run from an unbuilt checkout)."""
    try:
        return Version(engine_version)
    except InvalidVersion:
        raise HarnessError(f"engine version '{engine_version}' is not a version number; state the release with "
                           "--engine-version") from None


def engine_release(engine_version: str | None) -> Version:
    """The release whose rules apply; the pinned image's when none is given."""
    version = release_version(engine_version or PRODUCTION_ENGINE)
    if version < OLDEST_RULES:
        raise HarnessError(
            f"engine version {engine_version}: the calculator has no rules for vLLM releases before {OLDEST_RULES}"
        )
    return version


def engine_version_warnings(engine_version: str | None) -> list[str]:
    """A release newer than any the rules were checked against is priced, but not silently."""
    version = engine_release(engine_version)
    if version > NEWEST_CHECKED:
        return [f"engine version {version} is newer than any release the rules were checked against "
                f"(0.6 to 0.33): priced by 0.33's rules"
                + (f"; {EXTENSIBLE_CACHE_NOTE}" if version >= EXTENSIBLE_CACHE_SINCE else "")]
    return []


def check_engine_generation(version: Version, engine_generation: str | None) -> None:
    """A launch's stated engine must be one its release has: V1 from 0.7, V0 until 0.10."""
    if engine_generation == "V1" and version < V1_FIRST:
        raise HarnessError(f"--engine V1: vLLM {version} has no V1 engine (VLLM_USE_V1=1 runs it from {V1_FIRST})")
    if engine_generation == "V0" and version >= V0_REMOVED_IN:
        raise HarnessError(f"--engine V0: vLLM {version} has no V0 engine (removed in {V0_REMOVED_IN}); "
                           "give --engine-version 0.10.2 or earlier")


def gpu_memory_utilization(stated: float | None, version: Version) -> float:
    """The share of the GPU a start takes: as the launch states it, else its release's default."""
    if stated is not None:
        return stated
    return 0.92 if version >= HIGHER_UTILIZATION_SINCE else 0.9


def runs_v0(version: Version, engine_generation: str | None = None) -> bool:
    """Whether the V0 engine sized the cache: as stated ("V0"/"V1"), else the release's default engine."""
    return (engine_generation or ("V0" if version < V1_DEFAULT_SINCE else "V1")).upper() == "V0"
