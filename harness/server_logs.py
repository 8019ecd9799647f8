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
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic

from harness.errors import HarnessError
from harness.polyaxon_client import polyaxon_call
from harness.schema import RunFile
from harness.units import GiB

STARTUP_SCHEMA_VERSION = 1

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# `(EngineCore_DP0 pid=12)`, `(Worker_TP1 pid=9)`, `(VllmWorkerProcess pid=3)`, `(RayWorkerWrapper pid=3, ip=…)`
PROCESS_PREFIX = re.compile(
    r"\((?P<process>[A-Za-z][\w\-]*(?: (?:rank=|TP)\d+)?)(?: pid=\d+)?(?:, ip=[^)]*)?\)\s*"
)
# The rank in a worker's prefix: `Worker_TP1`, `VllmWorker TP1`, `VllmWorker rank=3`.
PROCESS_RANK = re.compile(r"(?:_TP| TP| rank=)(?P<rank>\d+)$")
# 0.11+: `INFO 11-29 14:50:31 [core.py:402] msg`; 0.6: `INFO 11-29 14:50:31 core.py:402] msg`.
HEADER = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?\s+"
    r"\[?(?P<source>[\w./-]+\.py:\d+)\]\s?(?P<message>.*)$"
)

NUMBER = r"-?[\d.]+"
KV_CACHE_SIZE = re.compile(r"^(?P<device>[\w +]+?) KV cache size: (?P<tokens>[\d,]+) tokens")
MAX_CONCURRENCY = re.compile(
    r"Maximum concurrency for (?P<length>[\d,]+) tokens per request: (?P<times>[\d.]+)x"
)
AVAILABLE_KV = re.compile(rf"^Available KV cache memory: (?P<gib>{NUMBER}) GiB")
RESERVED_KV = re.compile(
    rf"reserved (?P<gib>{NUMBER}) GiB memory for KV Cache as specified by kv_cache_memory_bytes"
)
CPU_KV_SPACE = re.compile(
    rf"^(?P<mode>Explicitly|Auto) set \((?P<kv_gib>{NUMBER})/(?P<node_gib>{NUMBER})\) GiB "
    r"for KV cache on node (?P<node>\d+)"
)
BLOCKS = re.compile(r"^# (?P<device>\w+) blocks: (?P<device_blocks>\d+)(?:, # CPU blocks: (?P<cpu_blocks>\d+))?")
MODEL_LOADING = re.compile(
    rf"^Model loading took (?P<amount>{NUMBER}) (?:GiB|GB)(?: memory)? and (?P<seconds>[\d.]+) seconds"
)
# Releases that print "GB" (0.6, early 0.8 V0) compute it with 2**30: GiB in all but name.
WEIGHTS_MEMORY_V06 = re.compile(rf"^Loading model weights took (?P<amount>{NUMBER}) GB")
WEIGHTS_TIME = re.compile(r"^Loading weights took (?P<seconds>[\d.]+) seconds")
GRAPH_CAPTURE = re.compile(rf"Graph capturing finished in (?P<seconds>\d+) secs(?:, took (?P<gib>{NUMBER}) GiB)?")
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
    rf"\((?P<needed>{NUMBER}) GiB KV cache is needed, which is larger than the available KV cache memory "
    rf"\((?P<available>{NUMBER}) GiB\)"
)
NON_DEFAULT_ARGS = re.compile(r"^non-default args: (?P<args>\{.*\})\s*$")
ENGINE_CONFIG = re.compile(r"^Initializing an? (?:(?P<generation>V\d) )?LLM engine \(v(?P<version>[^)]+)\) with config: (?P<config>.*)")
SERVER_VERSION = re.compile(r"^vLLM (?:API )?server version (?P<version>[^\s,]+)")
BANNER_VERSION = re.compile(r"█\s+version (?P<version>\d+\.\d+\S*)")
STARTING_TO_LOAD = re.compile(r"^Starting to load model")
# DEBUG breakdown, 0.11+: `Memory profiling takes 1.2 seconds. Total non KV cache memory: 9.1GiB; …`
PROFILE_V1 = re.compile(r"^Memory profiling takes (?P<seconds>[\d.]+) seconds\. (?P<parts>.*)$")
# 0.7-0.8 V0 (INFO, three lines): `Memory profiling takes 2.7 seconds`, `the current vLLM instance …`,
# `model weights take 0.52GiB; …; the rest of the memory reserved for KV Cache is 16.09GiB.`
PROFILE_V0_START = re.compile(r"^Memory profiling takes (?P<seconds>[\d.]+) seconds$")
PROFILE_V0_BUDGET = re.compile(
    rf"total_gpu_memory \((?P<total>{NUMBER})GiB\) x gpu_memory_utilization \((?P<util>[\d.]+)\)"
)
PROFILE_V0_PARTS = re.compile(r"^model weights take .*GiB")
V0_KV_REST = re.compile(rf"reserved for KV Cache is (?P<gib>{NUMBER})\s*GiB")
# 0.6: `Memory profiling results: total_gpu_memory=139.80GiB … kv_cache_size=122.71GiB gpu_memory_utilization=0.90`
PROFILE_V06 = re.compile(r"^Memory profiling results: (?P<pairs>.*)$")
# 0.6.5 development builds print the same figures as a table, one per line, after "Memory profiling results:".
PROFILE_TABLE_ROW = re.compile(
    rf"^(?P<label>total_gpu_memory|model weights take|non_torch_memory|PyTorch activation peak memory|"
    rf"available_kv_cache_memory)\s+(?P<gib>{NUMBER})GiB$"
)
TABLE_KEYS = {"total_gpu_memory": "total_gpu_memory_bytes", "model weights take": "model_weights_bytes",
              "non_torch_memory": "non_torch_memory_bytes",
              "PyTorch activation peak memory": "pytorch_activation_peak_memory_bytes",
              "available_kv_cache_memory": "kv_cache_size_bytes"}
GIB_PART = re.compile(rf"^(?P<label>.+?)(?::| takes| take| is)\s*(?P<gib>{NUMBER})\s*GiB\.?$")
KEY_VALUE = re.compile(rf"(?P<key>\w+)=(?P<value>{NUMBER})(?P<unit>Gi[Bb])?")

# Lines a start prints once it has sized its cache: memory, blocks, tokens or concurrency.
SIZED_MARKERS = (KV_CACHE_SIZE, MAX_CONCURRENCY, BLOCKS, AVAILABLE_KV, V0_KV_REST, PROFILE_V06)

TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
# argparse refusing the command line: `api_server.py: error: ...`, or a console script's `prog: error: ...`
ARGUMENT_ERROR = re.compile(r"^\S+: error: .+")
EXCEPTION_LINE = re.compile(r"^(?P<kind>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<text>.*))?$")
FAILURE_MARKERS = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "Engine process failed to start",
    "CUDA out of memory",
    "larger than the maximum number of tokens that can be stored in KV cache",
    "larger than the available KV cache memory",
    "No available memory for the cache blocks",
)
# Wrappers that only point at the root cause printed earlier.
GENERIC_FAILURES = ("See root cause above", "Engine core initialization failed", "Engine process failed to start")
MAX_EVIDENCE_LINES = 8
MAX_LOG_PAGES = 500

Stage = Literal["starting", "loading_weights", "sizing_kv_cache", "after_kv_cache"]


class CpuKvSpace(pydantic.BaseModel):
    """The CPU build's own account of the memory it set aside for the KV cache (GiB, 2 decimals)."""

    mode: Literal["explicit", "auto"]
    kv_cache_gib: float
    node_memory_gib: float
    numa_node: int


class MemoryProfile(pydantic.BaseModel):
    """The engine's memory-profiling breakdown, each figure keyed by its logged label."""

    profiling_seconds: float | None = None
    gpu_memory_utilization: float | None = None
    components_bytes: dict[str, int] = {}


class EngineFailure(pydantic.BaseModel):
    """Why a start-up produced no capacity: how far it got and the engine's own words."""

    stage: Stage
    error: str | None
    evidence: list[str]


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


@dataclass(frozen=True)
class LogLine:
    """One physical log line with colour and process prefix removed."""

    process: str | None
    level: str | None
    message: str
    stamp: str | None = None  # "MM-DD HH:MM:SS" from the header, where the line has one
    text: str = ""  # the physical line as logged (colour removed), prefix and header kept


def read_log_text(source: str | Path) -> str:
    """Read a log file or `-` (stdin); a binary file or a missing path is one line of bad input."""
    if str(source) == "-":
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise HarnessError(f"{path}: cannot read log: {error.strerror or error}") from None
        name = str(path)
    return decode_log_bytes(data, name)


def decode_log_bytes(data: bytes, name: str) -> str:
    """Logs are UTF-8 text; NUL bytes or undecodable data mean someone passed the wrong file."""
    if b"\x00" in data:
        raise HarnessError(f"{name}: binary file, not a text log (contains NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise HarnessError(f"{name}: not a UTF-8 text log (undecodable byte at offset {error.start})") from None


def read_run_log(run_dir: Path) -> str:
    """The engine log a local run captured beside its record (`engine.log`)."""
    path = Path(run_dir) / RunFile.ENGINE_LOG
    if not Path(run_dir).is_dir():
        raise HarnessError(f"{run_dir}: not a run directory")
    if not path.is_file():
        raise HarnessError(f"{run_dir}: no {RunFile.ENGINE_LOG} in this run directory")
    return read_log_text(path)


def fetch_polyaxon_run_log(run_uuid: str, project: str, client: Any = None) -> str:
    """A Polyaxon run's logs joined into one text, page by page (the API returns up to 2,000 lines a call).

    `client` is a polyaxon `RunClient` for that run; by default one is made from the CLI's configuration.
    """
    owner, _, name = project.partition("/")
    if not owner or not name or "/" in name:
        raise HarnessError(f"--project must be OWNER/NAME, got '{project}'")
    if client is None:
        from polyaxon.client import RunClient

        client = RunClient(owner=owner, project=name, run_uuid=run_uuid, manual_exceptions_handling=True)
    lines: list[str] = []
    last_file = last_time = None
    for _ in range(MAX_LOG_PAGES):
        page = polyaxon_call(f"Polyaxon run {run_uuid} in {project}: could not read its logs",
                             lambda: client.get_logs(last_file=last_file, last_time=last_time))
        entries = (page.logs if page is not None else None) or []
        if not entries:
            break
        lines.extend(entry.value for entry in entries if entry.value)
        if (page.last_file, page.last_time) == (last_file, last_time):
            break
        last_file, last_time = page.last_file, page.last_time
    return "\n".join(lines)


def split_log_lines(text: str) -> list[LogLine]:
    """Strip colour, carriage-return progress bars and process prefixes; keep header-less lines raw."""
    lines: list[LogLine] = []
    for physical in re.split(r"\r\n|\r|\n", ANSI_ESCAPE.sub("", text)):
        stripped = physical.strip()
        if not stripped:
            continue
        prefix = PROCESS_PREFIX.match(stripped)
        process = prefix.group("process") if prefix else None
        rest = stripped[prefix.end():] if prefix else stripped
        header = HEADER.search(rest)
        if header:
            lines.append(LogLine(process, header.group("level"), header.group("message").strip(),
                                 header.group("stamp"), stripped))
        else:
            lines.append(LogLine(process, None, rest, None, stripped))
    return lines


def parse_startup_log(text: str, start: int | None = None) -> StartupCapacity:
    """Parse a start-up log; unknown lines are ignored, a missing capacity line is diagnosed.

    A text that holds several start-ups (see `split_starts`) is never read as one: its figures come
    from one start, the last unless `start` (counted from 1) names another.
    """
    if "\x00" in text:
        raise HarnessError("not a text log: it contains NUL bytes")
    starts = split_starts(split_log_lines(text))
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
        if weights or STARTING_TO_LOAD.search(message) or _is_failure_marker(message):
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
            stage = _later(stage, "loading_weights")
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
            available.append(_gib_to_bytes(match.group("available")))
            found["kv_cache_bytes_needed"] = _gib_to_bytes(match.group("needed"))
        if match := BLOCKS_AFTER_INIT.search(message):
            found.setdefault("num_gpu_blocks", int(match.group("blocks")))
        if match := AVAILABLE_KV.search(message):
            available.append(_gib_to_bytes(match.group("gib")))
            if line.process and (rank := PROCESS_RANK.search(line.process)):
                by_rank[int(rank.group("rank"))] = available[-1]
        elif match := RESERVED_KV.search(message):
            found.setdefault("reserved_kv_bytes", _gib_to_bytes(match.group("gib")))
        elif match := CPU_KV_SPACE.search(message):
            found["cpu_kv_space"] = CpuKvSpace(
                mode="explicit" if match.group("mode") == "Explicitly" else "auto",
                kv_cache_gib=float(match.group("kv_gib")),
                node_memory_gib=float(match.group("node_gib")),
                numa_node=int(match.group("node")),
            )
        elif match := MODEL_LOADING.search(message):
            found.setdefault("model_weights_bytes", _gib_to_bytes(match.group("amount")))
            found.setdefault("model_loading_seconds", float(match.group("seconds")))
            stage = _later(stage, "sizing_kv_cache")
        elif match := WEIGHTS_MEMORY_V06.search(message):
            found.setdefault("model_weights_bytes", _gib_to_bytes(match.group("amount")))
            stage = _later(stage, "sizing_kv_cache")
        elif match := WEIGHTS_TIME.search(message):
            found.setdefault("weights_loading_seconds", float(match.group("seconds")))
            stage = _later(stage, "sizing_kv_cache")
        elif match := GRAPH_CAPTURE.search(message):
            found.setdefault("cuda_graph_seconds", float(match.group("seconds")))
            if match.group("gib") is not None:
                found.setdefault("cuda_graph_bytes", _gib_to_bytes(match.group("gib")))
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
        elif profile := _memory_profile_line(message, profiles.get(line.process), found):
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
    failure = None if capacity_found else _failure(lines, stage)
    if failure is None and capacity_found:
        failure = _failure_after_capacity(lines)
    return StartupCapacity(
        capacity_found=capacity_found,
        diagnosis=_diagnosis(capacity_found, failure, lines),
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


def _memory_profile_line(message: str, profile: MemoryProfile | None, found: dict[str, Any]) -> MemoryProfile | None:
    """Fold one of the three memory-profiling formats into the running breakdown."""
    if match := PROFILE_V1.search(message):
        profile = profile or MemoryProfile()
        profile.profiling_seconds = float(match.group("seconds"))
        profile.components_bytes.update(_gib_parts(match.group("parts")))
    elif match := PROFILE_V0_START.search(message):
        profile = profile or MemoryProfile()
        profile.profiling_seconds = float(match.group("seconds"))
    elif match := PROFILE_V0_BUDGET.search(message):
        profile = profile or MemoryProfile()
        profile.gpu_memory_utilization = float(match.group("util"))
        profile.components_bytes["total_gpu_memory_bytes"] = _gib_to_bytes(match.group("total"))
    elif PROFILE_V0_PARTS.search(message):
        profile = profile or MemoryProfile()
        profile.components_bytes.update(_gib_parts(message))
        if rest := V0_KV_REST.search(message):
            found["profiled_kv_bytes"] = _gib_to_bytes(rest.group("gib"))
    elif match := PROFILE_TABLE_ROW.search(message):
        profile = profile or MemoryProfile()
        key = TABLE_KEYS[match.group("label")]
        profile.components_bytes[key] = _gib_to_bytes(match.group("gib"))
        if key == "kv_cache_size_bytes":
            found["profiled_kv_bytes"] = profile.components_bytes[key]
    elif match := PROFILE_V06.search(message):
        profile = profile or MemoryProfile()
        for pair in KEY_VALUE.finditer(match.group("pairs")):
            if pair.group("unit"):
                profile.components_bytes[f"{pair.group('key')}_bytes"] = _gib_to_bytes(pair.group("value"))
            elif pair.group("key") == "gpu_memory_utilization":
                profile.gpu_memory_utilization = float(pair.group("value"))
        if "kv_cache_size_bytes" in profile.components_bytes:
            found["profiled_kv_bytes"] = profile.components_bytes["kv_cache_size_bytes"]
    return profile


def _gib_parts(text: str) -> dict[str, int]:
    parts: dict[str, int] = {}
    for part in text.split(";"):
        if match := GIB_PART.search(part.strip()):
            parts[f"{_snake(match.group('label'))}_bytes"] = _gib_to_bytes(match.group("gib"))
    return parts


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


def _failure(lines: list[LogLine], stage: Stage) -> EngineFailure | None:
    evidence = _error_lines(lines)
    if not evidence:
        return None
    return EngineFailure(stage=stage, error=_root_cause(lines), evidence=evidence[:MAX_EVIDENCE_LINES])


def _failure_after_capacity(lines: list[LogLine]) -> EngineFailure | None:
    """A start that sized its cache can still die later (graph capture, warm-up): keep that too."""
    if not any(_is_failure_marker(line.message) for line in lines):
        return None
    return EngineFailure(stage="after_kv_cache", error=_root_cause(lines), evidence=_error_lines(lines)[:MAX_EVIDENCE_LINES])


def _error_lines(lines: Iterable[LogLine]) -> list[str]:
    """Error messages, failure markers and exception lines, without the traceback frames between them."""
    evidence: list[str] = []
    in_traceback = False
    for line in lines:
        message = line.message
        if TRACEBACK.search(message):
            in_traceback = True
            continue
        if EXCEPTION_LINE.search(message) or ARGUMENT_ERROR.search(message):
            in_traceback = False
            evidence.append(message)
        elif _is_failure_marker(message) or (line.level in ("ERROR", "CRITICAL") and not in_traceback):
            evidence.append(message)
    return list(dict.fromkeys(evidence))


def engine_error_line(log_text: str) -> str | None:
    """The engine's own explanation of why it stopped, from its log as written (prefixes, headers, colour)."""
    return _root_cause(split_log_lines(log_text))


def _root_cause(lines: list[LogLine]) -> str | None:
    """The first specific exception or argument error: later ones usually just say 'see root cause above'.
    Without one, the first failure marker, else the first ERROR line; None when there is none of those."""
    exceptions = [
        line.message for line in lines if EXCEPTION_LINE.search(line.message) or ARGUMENT_ERROR.search(line.message)
    ]
    specific = [text for text in exceptions if not any(generic in text for generic in GENERIC_FAILURES)]
    if specific:
        return specific[0]
    if exceptions:
        return exceptions[0]
    markers = [line.message for line in lines if _is_failure_marker(line.message)]
    errors = [line.message for line in lines if line.level in ("ERROR", "CRITICAL")]
    return (markers or errors or [None])[0]


def _is_failure_marker(message: str) -> bool:
    return any(marker in message for marker in FAILURE_MARKERS)


def _diagnosis(capacity_found: bool, failure: EngineFailure | None, lines: list[LogLine]) -> str:
    if capacity_found:
        return "capacity found" if failure is None else f"capacity found, then the engine failed: {failure.error}"
    if not lines:
        return "no capacity found: the log is empty"
    if failure is not None:
        where = {
            "starting": "before loading the model",
            "loading_weights": "while loading the model weights",
            "sizing_kv_cache": "after loading the weights, while sizing the KV cache",
            "after_kv_cache": "after sizing the KV cache",
        }[failure.stage]
        return f"no capacity found: the engine failed while loading ({where}): {failure.error}"
    if not any(line.level for line in lines):
        return "no capacity found: no vLLM log lines in this text"
    return "no capacity found: the log ends before the engine reported its capacity (truncated, or still starting)"


def _later(current: Stage, candidate: Stage) -> Stage:
    order: tuple[Stage, ...] = ("starting", "loading_weights", "sizing_kv_cache", "after_kv_cache")
    return candidate if order.index(candidate) > order.index(current) else current


def _literal_dict(text: str) -> dict[str, Any] | None:
    """The args dict is a Python repr; values that are not literals (objects) leave only the raw text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _integer(text: str) -> int:
    return int(text.replace(",", ""))


def _gib_to_bytes(text: str) -> int:
    return round(float(text) * GiB)


def _snake(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
