"""Read the KV capacity vLLM logs once at start-up, for every release the harness meets.

The capacity an engine actually exposes is printed, not exported, by most releases: 0.6 counts GPU
blocks, 0.8 V1 and 0.11 print tokens and maximum concurrency on separate lines (once per tensor-parallel
rank), 0.2x-0.33 print both on one line (`CPU` instead of `GPU` on the CPU build), and the CPU build
also says how much memory it set aside. This module turns any of those logs into one `StartupCapacity`.
A log without a capacity line is a result too: it says whether, and at which stage, the engine failed.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Literal

import pydantic

from harness.errors import HarnessError
from harness.observe.engine_failure import (
    EngineFailure,
    Stage,
    diagnosis,
    failure_after_capacity,
    failure_while,
    is_failure_marker,
    later_stage,
)
from harness.observe.log_lines import LOGGED_NUMBER, LogLine, split_log_lines
from harness.observe.memory_profile import PROFILE_V06, V0_KV_REST, MemoryProfile, memory_profile_line
from harness.redact import redact_text
from harness.units import gib_to_bytes

STARTUP_SCHEMA_VERSION = 1

# The rank in a worker's prefix: `Worker_TP1`, `VllmWorker TP1`, `VllmWorker rank=3`.
PROCESS_RANK = re.compile(r"(?:_TP| TP| rank=)(?P<rank>\d+)$")

KV_CACHE_SIZE = re.compile(r"^(?P<device>[\w +]+?) KV cache size: (?P<tokens>[\d,]+) tokens")
MAX_CONCURRENCY = re.compile(
    r"Maximum concurrency for (?P<length>[\d,]+) tokens per request: (?P<times>[\d.]+)x"
)
AVAILABLE_KV = re.compile(rf"^Available KV cache memory: (?P<gib>{LOGGED_NUMBER}) GiB")
RESERVED_KV = re.compile(
    rf"reserved (?P<gib>{LOGGED_NUMBER}) GiB memory for KV Cache as specified by kv_cache_memory_bytes"
)
CPU_KV_SPACE = re.compile(
    rf"^(?P<mode>Explicitly|Auto) set \((?P<kv_gib>{LOGGED_NUMBER})/(?P<node_gib>{LOGGED_NUMBER})\) GiB "
    r"for KV cache on node (?P<node>\d+)"
)
BLOCKS = re.compile(r"^# (?P<device>\w+) blocks: (?P<device_blocks>\d+)(?:, # CPU blocks: (?P<cpu_blocks>\d+))?")
MODEL_LOADING = re.compile(
    rf"^Model loading took (?P<amount>{LOGGED_NUMBER}) (?:GiB|GB)(?: memory)? and (?P<seconds>[\d.]+) seconds"
)
# Releases that print "GB" (0.6, early 0.8 V0) compute it with 2**30: GiB in all but name.
WEIGHTS_MEMORY_V06 = re.compile(rf"^Loading model weights took (?P<amount>{LOGGED_NUMBER}) GB")
WEIGHTS_TIME = re.compile(r"^Loading weights took (?P<seconds>[\d.]+) seconds")
GRAPH_CAPTURE = re.compile(
    rf"Graph capturing finished in (?P<seconds>\d+) secs(?:, took (?P<gib>{LOGGED_NUMBER}) GiB)?")
TORCH_COMPILE = re.compile(r"torch\.compile takes (?P<seconds>[\d.]+) s in total")
INIT_ENGINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[\d.]+) (?:s\b|seconds)"
)
MAX_MODEL_LEN = re.compile(r"^Using max model len (?P<length>\d+)")
# 0.10 API server: `vllm cache_config_info with initialization after num_gpu_blocks is: 5867`
BLOCKS_AFTER_INIT = re.compile(r"num_gpu_blocks is: (?P<blocks>\d+)")
# Failed starts state the capacity they found too short: V0 in tokens, V1 as memory needed vs available.
V0_TOO_FEW_TOKENS = re.compile(
    r"larger than the maximum number of tokens that can be stored in KV cache \((?P<tokens>\d+)\)"
)
V1_TOO_LITTLE_MEMORY = re.compile(
    rf"\((?P<needed>{LOGGED_NUMBER}) GiB KV cache is needed, which is larger than the available KV cache memory "
    rf"\((?P<available>{LOGGED_NUMBER}) GiB\)"
)
NON_DEFAULT_ARGS = re.compile(r"^non-default args: (?P<args>\{.*\})\s*$")
ENGINE_CONFIG = re.compile(
    r"^Initializing an? (?:(?P<generation>V\d) )?LLM engine \(v(?P<version>[^)]+)\) with config: (?P<config>.*)")
SERVER_VERSION = re.compile(r"^vLLM (?:API )?server version (?P<version>[^\s,]+)")
BANNER_VERSION = re.compile(r"█\s+version (?P<version>\d+\.\d+\S*)")
STARTING_TO_LOAD = re.compile(r"^Starting to load model")
# Lines a start prints once it has sized its cache: memory, blocks, tokens or concurrency.
SIZED_MARKERS = (KV_CACHE_SIZE, MAX_CONCURRENCY, BLOCKS, AVAILABLE_KV, V0_KV_REST, PROFILE_V06)




class CpuKvSpace(pydantic.BaseModel):
    """The CPU build's own account of the memory it set aside for the KV cache (GiB, 2 decimals)."""

    mode: Literal["explicit", "auto"]
    kv_cache_gib: float
    node_memory_gib: float
    numa_node: int


class StartupCapacity(pydantic.BaseModel):
    """Everything a vLLM start-up log says about the KV cache it built, with units in the names.

    Figures printed once per tensor-parallel rank keep every print (`..._per_print`, `..._per_rank`)
    and the headline is their minimum, as vLLM itself sizes every rank's cache by the smallest.
    Per-rank timings and weights are the first rank's. GiB figures are converted with 2**30 and
    carry the log's rounding (two decimals); `kv_cache_memory_bytes` from the arguments is exact.
    """

    schema_version: int = STARTUP_SCHEMA_VERSION
    capacity_found: bool
    diagnosis: str
    starts: int = 1  # how many start-ups the text holds (a retried launch, a file two launches appended to)
    start: int = 1  # which of them (from 1) these figures are from: each start is read on its own
    engine_version: str | None = None
    engine_generation: str | None = None
    model: str | None = None
    model_revision: str | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    tensor_parallel_size: int | None = None
    kv_cache_device: str | None = None
    kv_cache_tokens: int | None = None
    kv_cache_tokens_per_print: list[int] = []
    max_concurrency: float | None = None
    max_concurrency_per_print: list[float] = []
    max_concurrency_model_len: int | None = None
    max_model_len: int | None = None
    kv_cache_bytes_needed: int | None = None  # a refused start: memory one max_model_len request needs
    kv_cache_tokens_at_failure: int | None = None  # a refused V0 start: the tokens its cache would have held
    available_kv_cache_bytes: int | None = None
    available_kv_cache_bytes_per_rank: list[int] = []
    available_kv_cache_bytes_by_rank: dict[int, int] = {}
    kv_cache_memory_bytes: int | None = None
    cpu_kv_space: CpuKvSpace | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    model_weights_bytes: int | None = None
    model_loading_seconds: float | None = None
    weights_loading_seconds: float | None = None
    cuda_graph_bytes: int | None = None
    cuda_graph_seconds: float | None = None
    torch_compile_seconds: float | None = None
    init_seconds: float | None = None
    non_default_args: dict[str, Any] | None = None
    non_default_args_text: str | None = None
    memory_profile: MemoryProfile | None = None
    failure: EngineFailure | None = None


def parse_startup_log(text: str, start: int | None = None) -> StartupCapacity:
    """Parse a start-up log; unknown lines are ignored, a missing capacity line is diagnosed.

    A text that holds several start-ups (see `split_starts`) is never read as one: its figures come
    from one start, the last unless `start` (counted from 1) names another. Secrets are masked first (an
    older vLLM logs its `api_key` among the non-default args): nothing read from a log can carry one.
    """
    if "\x00" in text:
        raise HarnessError("not a text log: it contains NUL bytes")
    starts = split_starts(split_log_lines(redact_text(text)))
    chosen = len(starts) if start is None else start
    if not 1 <= chosen <= len(starts):
        raise HarnessError(f"start {start} asked for, but the log holds {len(starts)} start(s)")
    parsed = _parse_start(starts[chosen - 1])
    return parsed.model_copy(update={"starts": len(starts), "start": chosen})


def split_starts(lines: list[LogLine]) -> list[list[LogLine]]:
    """The start-ups a log holds, each with its own lines, in order.

    A new start begins where a line that opens a start-up (the server's version or arguments, an
    engine's config) follows lines of a start that had already begun loading or sizing, or where a
    process reports loading weights again after it had already sized its cache. Every rank printing
    its own figures, and the API server's lines interleaved with the engine's, stay in one start.
    """
    starts: list[list[LogLine]] = [[]]
    loading: set[str | None] = set()  # processes of the current start that began loading or sizing
    sized: set[str | None] = set()  # processes of the current start that printed a capacity line
    latest: str | None = None  # the current start's latest time stamp
    for line in lines:
        message = line.message
        opens = bool(SERVER_VERSION.search(message) or BANNER_VERSION.search(message)
                     or NON_DEFAULT_ARGS.search(message))
        engine = bool(ENGINE_CONFIG.search(message))
        weights = bool(MODEL_LOADING.search(message) or WEIGHTS_MEMORY_V06.search(message))
        # A line stamped before the start's latest one was printed during it (excerpts are posted out of order).
        later = line.stamp is None or latest is None or line.stamp >= latest
        if later and ((opens and loading) or (engine and line.process in loading)
                      or (weights and line.process in sized)):
            starts.append([])
            loading, sized, latest = set(), set(), None
        starts[-1].append(line)
        if line.stamp is not None and (latest is None or line.stamp > latest):
            latest = line.stamp
        if weights or STARTING_TO_LOAD.search(message) or is_failure_marker(message):
            loading.add(line.process)
        if any(pattern.search(message) for pattern in SIZED_MARKERS):
            loading.add(line.process)
            sized.add(line.process)
    return [start for start in starts if start] or [[]]


def _parse_start(lines: list[LogLine]) -> StartupCapacity:
    found: dict[str, Any] = {}
    tokens: list[int] = []
    concurrency: list[float] = []
    available: list[int] = []
    profiles: dict[str | None, MemoryProfile] = {}
    by_rank: dict[int, int] = {}
    stage: Stage = "starting"
    for line in lines:
        message = line.message
        if STARTING_TO_LOAD.search(message):
            stage = later_stage(stage, "loading_weights")
        if match := KV_CACHE_SIZE.search(message):
            found["kv_cache_device"] = match.group("device")
            tokens.append(_integer(match.group("tokens")))
            stage = "after_kv_cache"
        if match := MAX_CONCURRENCY.search(message):
            concurrency.append(float(match.group("times")))
            found["max_concurrency_model_len"] = _integer(match.group("length"))
            stage = "after_kv_cache"
        if match := BLOCKS.search(message):
            found["kv_cache_device"] = found.get("kv_cache_device") or match.group("device")
            found["num_gpu_blocks"] = int(match.group("device_blocks"))
            if match.group("cpu_blocks") is not None:
                found["num_cpu_blocks"] = int(match.group("cpu_blocks"))
            stage = "after_kv_cache"
        if match := V0_TOO_FEW_TOKENS.search(message):
            found["kv_cache_tokens_at_failure"] = int(match.group("tokens"))
        if match := V1_TOO_LITTLE_MEMORY.search(message):
            available.append(gib_to_bytes(match.group("available")))
            found["kv_cache_bytes_needed"] = gib_to_bytes(match.group("needed"))
        if match := BLOCKS_AFTER_INIT.search(message):
            found.setdefault("num_gpu_blocks", int(match.group("blocks")))
        if match := AVAILABLE_KV.search(message):
            available.append(gib_to_bytes(match.group("gib")))
            if line.process and (rank := PROCESS_RANK.search(line.process)):
                by_rank[int(rank.group("rank"))] = available[-1]
        elif match := RESERVED_KV.search(message):
            found.setdefault("reserved_kv_bytes", gib_to_bytes(match.group("gib")))
        elif match := CPU_KV_SPACE.search(message):
            found["cpu_kv_space"] = CpuKvSpace(
                mode="explicit" if match.group("mode") == "Explicitly" else "auto",
                kv_cache_gib=float(match.group("kv_gib")),
                node_memory_gib=float(match.group("node_gib")),
                numa_node=int(match.group("node")),
            )
        elif match := MODEL_LOADING.search(message):
            found.setdefault("model_weights_bytes", gib_to_bytes(match.group("amount")))
            found.setdefault("model_loading_seconds", float(match.group("seconds")))
            stage = later_stage(stage, "sizing_kv_cache")
        elif match := WEIGHTS_MEMORY_V06.search(message):
            found.setdefault("model_weights_bytes", gib_to_bytes(match.group("amount")))
            stage = later_stage(stage, "sizing_kv_cache")
        elif match := WEIGHTS_TIME.search(message):
            found.setdefault("weights_loading_seconds", float(match.group("seconds")))
            stage = later_stage(stage, "sizing_kv_cache")
        elif match := GRAPH_CAPTURE.search(message):
            found.setdefault("cuda_graph_seconds", float(match.group("seconds")))
            if match.group("gib") is not None:
                found.setdefault("cuda_graph_bytes", gib_to_bytes(match.group("gib")))
        elif match := TORCH_COMPILE.search(message):
            found["torch_compile_seconds"] = float(match.group("seconds"))
        elif match := INIT_ENGINE.search(message):
            found["init_seconds"] = float(match.group("seconds"))
        elif match := MAX_MODEL_LEN.search(message):
            found["max_model_len"] = int(match.group("length"))
        elif match := NON_DEFAULT_ARGS.search(message):
            found["non_default_args_text"] = match.group("args")
            found["non_default_args"] = _literal_dict(match.group("args"))
        elif match := ENGINE_CONFIG.search(message):
            found["engine_version"] = match.group("version")
            found["engine_generation"] = match.group("generation") or "V0"
            found.update(_engine_config_fields(match.group("config")))
        elif (match := SERVER_VERSION.search(message)) or (match := BANNER_VERSION.search(message)):
            found.setdefault("engine_version", match.group("version"))
        elif profile := memory_profile_line(message, profiles.get(line.process), found):
            profiles[line.process] = profile

    # Every rank profiles its own memory; the first to print (rank 0) stands for the engine.
    first_profile = next(iter(profiles.values()), None)
    if by_rank:
        found["available_kv_cache_bytes_by_rank"] = dict(sorted(by_rank.items()))
    return _assemble(found, tokens, concurrency, available, first_profile, stage, lines)


def _assemble(
    found: dict[str, Any],
    tokens: list[int],
    concurrency: list[float],
    available: list[int],
    profile: MemoryProfile | None,
    stage: Stage,
    lines: list[LogLine],
) -> StartupCapacity:
    reserved = found.pop("reserved_kv_bytes", None)
    config_max_seq_len = found.pop("config_max_seq_len", None)
    if found.get("max_model_len") is None and config_max_seq_len is not None:
        found["max_model_len"] = config_max_seq_len  # releases before 0.9 only print it in the config
    profiled_kv = found.pop("profiled_kv_bytes", None)
    if profiled_kv is not None and not available:
        available.append(profiled_kv)
    args = found.get("non_default_args") or {}
    exact_reservation = args.get("kv_cache_memory_bytes")
    if isinstance(exact_reservation, int) and not isinstance(exact_reservation, bool):
        found["kv_cache_memory_bytes"] = exact_reservation
    elif reserved is not None:
        found["kv_cache_memory_bytes"] = reserved
    if found.get("tensor_parallel_size") is None and isinstance(args.get("tensor_parallel_size"), int):
        found["tensor_parallel_size"] = args["tensor_parallel_size"]

    capacity_found = bool(tokens or concurrency or "num_gpu_blocks" in found)
    failure = None if capacity_found else failure_while(lines, stage)
    if failure is None and capacity_found:
        failure = failure_after_capacity(lines)
    return StartupCapacity(
        capacity_found=capacity_found,
        diagnosis=diagnosis(capacity_found, failure, lines),
        kv_cache_tokens=min(tokens) if tokens else None,
        kv_cache_tokens_per_print=tokens,
        max_concurrency=min(concurrency) if concurrency else None,
        max_concurrency_per_print=concurrency,
        available_kv_cache_bytes=min(available) if available else None,
        available_kv_cache_bytes_per_rank=available,
        memory_profile=profile,
        failure=failure,
        **found,
    )


def _engine_config_fields(config: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if match := re.search(r"(?:^|, )model='(?P<value>[^']*)'", config):
        fields["model"] = match.group("value")
    if match := re.search(r"(?:^|, )revision=(?P<value>[^,\s]+)", config):
        fields["model_revision"] = None if match.group("value") == "None" else match.group("value")
    if match := re.search(r"(?:^|, )dtype=(?:torch\.)?(?P<value>\w+)", config):
        fields["dtype"] = match.group("value")
    if match := re.search(r"(?:^|, )kv_cache_dtype=(?P<value>\w+)", config):
        fields["kv_cache_dtype"] = match.group("value")
    if match := re.search(r"(?:^|, )tensor_parallel_size=(?P<value>\d+)", config):
        fields["tensor_parallel_size"] = int(match.group("value"))
    if match := re.search(r"(?:^|, )max_seq_len=(?P<value>\d+)", config):
        fields["config_max_seq_len"] = int(match.group("value"))
    return fields


def _literal_dict(text: str) -> dict[str, Any] | None:
    """The args dict is a Python repr; values that are not literals (objects) leave only the raw text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _integer(text: str) -> int:
    return int(text.replace(",", ""))
