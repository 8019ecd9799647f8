"""Read the KV capacity vLLM logs once at start-up, for every release the harness meets.

The capacity an engine actually exposes is printed, not exported, by most releases: 0.6 counts GPU
blocks, 0.8 V1 and 0.11 print tokens and maximum concurrency on separate lines (once per tensor-parallel
rank), 0.2x-0.33 print both on one line (`CPU` instead of `GPU` on the CPU build), and the CPU build
also says how much memory it set aside. This module turns any of those logs into one `StartupCapacity`.
A log without a capacity line is a result too: it says whether, and at which stage, the engine failed.
"""

from __future__ import annotations

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
)
from harness.observe.log_lines import Count, Fraction, LogLine, split_log_lines, unwrapped_json_records
from harness.observe.memory_profile import MemoryProfile
from harness.observe.startup_lines import (
    BANNER_VERSION,
    ENGINE_CONFIG,
    MODEL_LOADING,
    NON_DEFAULT_ARGS,
    ONCE_PER_PROCESS,
    PROCESS_RANK,
    SERVER_VERSION,
    SIZED_MARKERS,
    STARTING_TO_LOAD,
    WEIGHTS_MEMORY_V06,
    CpuKvSpace,
    StartFacts,
)
from harness.redact import redact_text
from harness.units import MAX_LOGGED_VALUE, abbreviated, logged_count

STARTUP_SCHEMA_VERSION = 1

class StartupCapacity(pydantic.BaseModel):
    """Everything a vLLM start-up log says about the KV cache it built, with units in the names.

    Figures printed once per tensor-parallel rank keep every print (`..._per_print`, `..._per_rank`)
    and the headline is their minimum, as vLLM itself sizes every rank's cache by the smallest.
    Per-rank timings and weights are the first rank's. GiB figures are converted with 2**30 and
    carry the log's rounding (two decimals); `kv_cache_memory_bytes` from the arguments is exact.
    The line readers fill it by field name, so a name it does not have is refused, not dropped.
    """

    model_config = pydantic.ConfigDict(extra="forbid")

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
    quantization: str | None = None  # the engine config's, else the arguments' (a checkpoint's format, or online)
    tensor_parallel_size: Count | None = None
    tensor_parallel_size_from_ranks: bool = False  # no config line: counted from the workers' `TP<n>` prefixes
    pipeline_parallel_size: Count | None = None
    decode_context_parallel_size: Count | None = None  # ranks one sequence's cache is spread over (MLA, 0.11+)
    speculative_method: str | None = None  # the engine config line's SpeculativeConfig method, as printed
    speculative_tokens: Count | None = None
    top_k_top_p_sampler: Literal["flashinfer", "pytorch"] | None = None  # V1's, where the log names it
    top_k_top_p_sampler_line: str | None = None  # the first line that names it
    flashinfer_loaded_line: str | None = None  # the line that shows FlashInfer's attention chosen, so importable
    lora_adapters_line: str | None = None  # the line that shows LoRA adapters served (or the arguments' enable_lora)
    gpu_name: str | None = None  # the GPU a line names (a fused-MoE config's device_name, a dtype warning, nvidia-smi)
    gpu_name_line: str | None = None  # the first line that names it
    enforce_eager: bool | None = None  # the engine config's (else the arguments'): no CUDA graphs captured
    device: str | None = None  # the engine config's device_config (cpu, cuda, xpu, ...)
    kv_cache_device: str | None = None  # as the capacity line labels it (V1 before 0.12 says "GPU" on a CPU too)
    kv_cache_tokens: int | None = None
    kv_cache_tokens_per_print: list[int] = []
    max_concurrency: float | None = None
    max_concurrency_per_print: list[float] = []
    max_concurrency_model_len: Count | None = None
    max_model_len: Count | None = None
    max_num_batched_tokens: Count | None = None  # the scheduler's batch, which the profiling run fills
    max_num_seqs: Count | None = None  # from the arguments: vLLM prints no line of its own for it
    gpu_memory_utilization: Fraction | None = None  # from the arguments, where the launch set it
    block_size: Count | None = None  # tokens per KV block, from the arguments, where the launch set it
    kv_cache_bytes_needed: int | None = None  # a refused start: memory one max_model_len request needs
    kv_cache_tokens_at_failure: int | None = None  # a refused V0 start: the tokens its cache would have held
    available_kv_cache_bytes: int | None = None
    available_kv_cache_bytes_per_rank: list[int] = []
    available_kv_cache_bytes_by_rank: dict[int, int] = {}
    kv_cache_memory_bytes: Count | None = None
    kv_cache_memory_bytes_exact: bool = False  # the reservation is the argument's bytes, not a GiB line's
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


TP_PREFIX = re.compile(r"(?:_| )TP(?P<rank>\d+)$")


def parse_startup_log(text: str, start: int | None = None) -> StartupCapacity:
    """Parse a start-up log; unknown lines are ignored, a missing capacity line is diagnosed.

    A text that holds several start-ups (see `split_starts`) is never read as one: its figures come
    from one start, the last unless `start` (counted from 1) names another. Secrets are masked first (an
    older vLLM logs its `api_key` among the non-default args), in the text JSON records carry rather than in
    their escaped form: nothing read from a log can carry one.
    """
    if "\x00" in text:
        raise HarnessError("not a text log: it contains NUL bytes")
    starts = split_starts(split_log_lines(redact_text(unwrapped_json_records(text))))
    chosen = len(starts) if start is None else start
    if not 1 <= chosen <= len(starts):
        raise HarnessError(f"--start {start}: the log holds {len(starts)} start(s); give 1 to {len(starts)}")
    try:
        parsed = _parse_start(starts[chosen - 1])
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        shown = abbreviated(repr(first["input"]))
        raise HarnessError(f"the log states {field} {shown}, which no start of vLLM runs with "
                           f"({first['msg'][0].lower()}{first['msg'][1:]}): the log is damaged or edited") from None
    return parsed.model_copy(update={"starts": len(starts), "start": chosen})


# Process names one process of a start has: the API server (one of several: ApiServer_0), the engine core (one
# per data-parallel rank), a rank's worker (Worker_TP0, Worker_PP1_TP0, VllmWorker rank=0). Other names are shared:
# V0's VllmWorkerProcess, Ray's RayWorkerWrapper, and a worker's bare "Worker" before it knows its rank.
ONCE_A_START_PROCESS = re.compile(r"APIServer|ApiServer_\d+|EngineCore(?:_DP\d+)?|Worker(?:_[A-Z]+\d+)+"
                                  r"|VllmWorker (?:rank=|TP)\d+")


def split_starts(lines: list[LogLine]) -> list[list[LogLine]]:
    """The start-ups a log holds, each with its own lines, in order (`StartBoundary` says where one begins)."""
    starts: list[list[LogLine]] = [[]]
    boundary = StartBoundary()
    for line in lines:
        if boundary.begins_another(line):
            starts.append([])
            boundary = StartBoundary()
        starts[-1].append(line)
        boundary.record(line)
    return [start for start in starts if start] or [[]]


class StartBoundary:
    """What the current start has printed so far, to tell where the next one begins.

    A new start begins where a line that opens a start-up (the server's version or arguments, an engine's
    config) follows lines of a start that had already begun loading or sizing, where a process reports loading
    weights again after it had already sized its cache, where a process (by its pid) prints its memory profile
    or block count a second time, or where a process that runs once a start (the API server, an engine core, a
    rank's worker) shows another pid: two pasted excerpts, the second without its header. Every rank printing
    its own figures, and the API server's lines interleaved with the engine's, stay in one start.
    """

    def __init__(self) -> None:
        self.loading: set[str | None] = set()  # processes that began loading or sizing
        self.sized: set[str | None] = set()  # processes that printed a capacity line
        # (speaker, ONCE_PER_PROCESS index) printed, and the (stamp, message) it printed
        self.profiled: dict[tuple[object, int], tuple[str | None, str]] = {}
        self.pids: dict[str, str] = {}  # the pid each once-a-start process has
        self.latest: str | None = None  # the latest time stamp

    def begins_another(self, line: LogLine) -> bool:
        """Whether `line` belongs to a start after this one."""
        message = line.message
        if line.process in self.pids and line.pid is not None and self.pids[line.process] != line.pid:
            return True  # another pid is another start, whenever it was stamped
        # A line stamped before the start's latest one was printed during it (excerpts are posted out of order).
        if line.stamp is not None and self.latest is not None and line.stamp < self.latest:
            return False
        opens = bool(SERVER_VERSION.search(message) or BANNER_VERSION.search(message)
                     or NON_DEFAULT_ARGS.search(message))
        # the same line again (a notebook's output that echoes every line) is not a second print
        printed_again = any(self.profiled.get(key, (line.stamp, message)) != (line.stamp, message)
                            for key in _once_per_process_keys(line))
        return ((opens and bool(self.loading)) or (bool(ENGINE_CONFIG.search(message)) and line.process in self.loading)
                or (_loads_weights(message) and line.process in self.sized) or printed_again)

    def record(self, line: LogLine) -> None:
        """Take `line` as the current start's."""
        message = line.message
        if line.stamp is not None and (self.latest is None or line.stamp > self.latest):
            self.latest = line.stamp
        if _loads_weights(message) or STARTING_TO_LOAD.search(message) or is_failure_marker(message):
            self.loading.add(line.process)
        if any(pattern.search(message) for pattern in SIZED_MARKERS):
            self.loading.add(line.process)
            self.sized.add(line.process)
        for key in _once_per_process_keys(line):
            self.profiled.setdefault(key, (line.stamp, message))
        if line.process is not None and line.pid is not None and ONCE_A_START_PROCESS.fullmatch(line.process):
            self.pids.setdefault(line.process, line.pid)


def _loads_weights(message: str) -> bool:
    return bool(MODEL_LOADING.search(message) or WEIGHTS_MEMORY_V06.search(message))


def _once_per_process_keys(line: LogLine) -> set[tuple[object, int]]:
    """The lines a process prints once a start that `line` is, keyed by its speaker; none without a pid, where
    ranks cannot be told apart."""
    if line.pid is None:
        return set()
    return {(line.speaker, index) for index, pattern in enumerate(ONCE_PER_PROCESS) if pattern.search(line.message)}


def _parse_start(lines: list[LogLine]) -> StartupCapacity:
    facts = StartFacts()
    for line in lines:
        facts.read(line)
    profiles = list(facts.profiles.values())
    if not facts.available:  # the profiles' own KV figures, where no "Available KV cache memory" line states them
        _read_profiles_kv(facts)
    if facts.by_rank:
        facts.found["available_kv_cache_bytes_by_rank"] = dict(sorted(facts.by_rank.items()))
    if "gpu_name" not in facts.found and len(facts.smi_rows) == 1:  # the engine names none; the table one model
        facts.found["gpu_name"], facts.found["gpu_name_line"] = next(iter(facts.smi_rows.items()))
    return _assemble(facts.found, facts.tokens, facts.concurrency, facts.available, binding_profile(profiles),
                     facts.stage, lines)


def _read_profiles_kv(facts: StartFacts) -> None:
    """Each process's KV memory as its profile states it, by rank where its prefix names one."""
    for (process, _), profile in facts.profiles.items():
        if profile.kv_cache_bytes is not None:
            facts.available.append(profile.kv_cache_bytes)
            if process and (rank := PROCESS_RANK.search(process)):
                facts.by_rank[logged_count(rank.group("rank"))] = profile.kv_cache_bytes


def binding_profile(profiles: list[MemoryProfile]) -> MemoryProfile | None:
    """The profile whose terms set the cache. Every rank profiles its own memory and vLLM sizes all caches by the
    smallest: V0's driver rank also samples, so its activation peak is the larger and its cache the smaller,
    whichever rank printed first. A format that states no KV figure per rank leaves the first to print."""
    stated = [profile for profile in profiles if profile.kv_cache_bytes is not None]
    if stated:
        return min(stated, key=lambda profile: profile.kv_cache_bytes or 0)
    return next(iter(profiles), None)


def tensor_parallel_ranks(lines: list[LogLine]) -> set[int]:
    """The tensor-parallel ranks whose workers wrote lines (`Worker_TP1`, `VllmWorker TP1`), for a log pasted
    without its engine config line. A bare `rank=` is the world rank, TP and PP together, so it is not read."""
    return {logged_count(match.group("rank")) for line in lines
            if line.process and (match := TP_PREFIX.search(line.process))}


# --dtype as the arguments spell it, as the engine config line prints it (torch's names)
DTYPE_ARGUMENTS = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
                   "float32": "float32"}


def _engine_facts_from_arguments(found: dict[str, Any], args: dict[str, Any]) -> None:
    """What the engine config line states, from the non-default arguments where the excerpt lacks that line."""
    for counted in ("tensor_parallel_size", "pipeline_parallel_size", "decode_context_parallel_size",
                    "max_num_batched_tokens", "max_num_seqs", "block_size", "max_model_len"):
        if found.get(counted) is None:
            found[counted] = argument_count(args, counted)
    for named in ("model", "kv_cache_dtype", "quantization"):
        if found.get(named) is None and isinstance(args.get(named), str):
            found[named] = args[named]
    if found.get("dtype") is None and isinstance(args.get("dtype"), str):
        found["dtype"] = DTYPE_ARGUMENTS.get(args["dtype"])  # 'auto' leaves it to the checkpoint: not known here
    if found.get("enforce_eager") is None and isinstance(args.get("enforce_eager"), bool):
        found["enforce_eager"] = args["enforce_eager"]
    if args.get("enable_lora") is True and found.get("lora_adapters_line") is None:
        found["lora_adapters_line"] = "non-default args: {'enable_lora': True, …}"
    if not isinstance(args.get("gpu_memory_utilization"), bool):  # a stated figure is checked as a Fraction
        found["gpu_memory_utilization"] = args.get("gpu_memory_utilization")
    speculative = args.get("speculative_config")  # {'method': 'mtp', 'num_speculative_tokens': 3}
    if found.get("speculative_method") is None and isinstance(speculative, dict) \
            and isinstance(speculative.get("method"), str):
        found.update(speculative_method=speculative["method"],
                     speculative_tokens=argument_count(speculative, "num_speculative_tokens"))


def argument_count(args: dict[str, Any], name: str) -> int | None:
    """A whole-number argument (a size, a count of bytes) as the log's arguments state it; None when not stated as
    one, refused outside 1 to 2**53, which no start of vLLM runs with (a damaged or edited log)."""
    value = args.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if not 1 <= value <= MAX_LOGGED_VALUE:
        raise HarnessError(f"the log states argument {name} {abbreviated(str(value))}, which no start of vLLM runs "
                           "with (not 1 to 2**53): the log is damaged or edited")
    return value


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
    if found.get("model_weights_bytes") is None and profile is not None:  # V0's profile line states them too
        found["model_weights_bytes"] = profile.components_bytes.get("model_weights_bytes")
    args = found.get("non_default_args") or {}
    exact_reservation = argument_count(args, "kv_cache_memory_bytes")
    if exact_reservation is not None:
        found.update(kv_cache_memory_bytes=exact_reservation, kv_cache_memory_bytes_exact=True)
    elif reserved is not None:
        found["kv_cache_memory_bytes"] = reserved
    _engine_facts_from_arguments(found, args)
    resolved = found.pop("resolved_kv_cache_dtype", None)
    if resolved is not None and found.get("kv_cache_dtype") in (None, "auto"):
        found["kv_cache_dtype"] = resolved  # what `auto` became: the checkpoint's own cache format
    if found.get("tensor_parallel_size") is None and (ranks := tensor_parallel_ranks(lines)):
        found.update(tensor_parallel_size=max(ranks) + 1, tensor_parallel_size_from_ranks=True)

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
