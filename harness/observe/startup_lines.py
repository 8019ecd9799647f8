"""One start-up line at a time: which figure it states, and how far the start had come when it did.

The patterns are vLLM's own wording, release by release; `StartFacts` gathers what they match into the
fields of a `StartupCapacity`, which the caller assembles once the start's lines are read.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic

from harness.errors import HarnessError
from harness.observe.engine_failure import Stage, later_stage
from harness.observe.log_lines import LOGGED_NUMBER, LogLine
from harness.observe.memory_profile import PROFILE_V06, V0_KV_REST, MemoryProfile, memory_profile_line
from harness.units import gib_to_bytes, logged_count, logged_figure

# The rank in a worker's prefix: `Worker_TP1`, `VllmWorker TP1`, `VllmWorker rank=3`.
PROCESS_RANK = re.compile(r"(?:_TP| TP| rank=)(?P<rank>\d+)$")

KV_CACHE_SIZE = re.compile(r"^(?P<device>[\w +]+?) KV cache size: (?P<tokens>[\d,]+) tokens")
MAX_CONCURRENCY = re.compile(
    r"Maximum concurrency for (?P<length>[\d,]+) tokens per request: (?P<times>\d+(?:\.\d+)?)x"
)
AVAILABLE_KV = re.compile(rf"^Available KV cache memory: (?P<gib>{LOGGED_NUMBER}) GiB")
RESERVED_KV = re.compile(
    rf"reserved (?P<gib>{LOGGED_NUMBER}) GiB memory for KV Cache as specified by kv_cache_memory_bytes"
)
CPU_KV_SPACE = re.compile(
    rf"^(?P<mode>Explicitly|Auto) set \((?P<kv_gib>{LOGGED_NUMBER})/(?P<node_gib>{LOGGED_NUMBER})\) GiB "
    r"for KV cache on node (?P<node>\d+)"
)
# The CPU build before 0.14 without VLLM_CPU_KVCACHE_SPACE: `kv_cache_space = 4 * GiB_bytes` (platforms/cpu.py, read in
# 0.8.3, 0.10.2, 0.11.0 and 0.12.0), exactly the whole GiB it prints.
CPU_KV_DEFAULT = re.compile(
    r"^Environment variable VLLM_CPU_KVCACHE_SPACE \(GiB\) for CPU backend is not set, using (?P<kv_gib>\d+) by default"
)
BLOCKS = re.compile(r"^# (?P<device>\w+) blocks: (?P<device_blocks>\d+)(?:, # CPU blocks: (?P<cpu_blocks>\d+))?")
MODEL_LOADING = re.compile(
    rf"^Model loading took (?P<amount>{LOGGED_NUMBER}) (?:GiB|GB)(?: memory)? and (?P<seconds>\d+(?:\.\d+)?) seconds"
)
# Releases that print "GB" (0.6, early 0.8 V0) compute it with 2**30: GiB in all but name.
WEIGHTS_MEMORY_V06 = re.compile(rf"^Loading model weights took (?P<amount>{LOGGED_NUMBER}) GB")
WEIGHTS_TIME = re.compile(r"^Loading weights took (?P<seconds>\d+(?:\.\d+)?) seconds")
GRAPH_CAPTURE = re.compile(
    rf"Graph capturing finished in (?P<seconds>\d+) secs(?:, took (?P<gib>{LOGGED_NUMBER}) GiB)?")
TORCH_COMPILE = re.compile(r"torch\.compile takes (?P<seconds>\d+(?:\.\d+)?) s in total")
INIT_ENGINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>\d+(?:\.\d+)?) (?:s\b|seconds)"
)
MAX_MODEL_LEN = re.compile(r"^Using max model len (?P<length>\d+)")
# The scheduler's batch, which the profiling run fills (V0 config.py and V1 scheduler config print it).
BATCHED_TOKENS = re.compile(r"^Chunked prefill is enabled with max_num_batched_tokens=(?P<tokens>\d+)")
# 0.11+ with decode context parallelism: every rank keeps 1/dcp of each sequence, and the logged tokens are ×dcp.
CONTEXT_PARALLEL = re.compile(r"^Multiplying the GPU KV cache size by the dcp_world_size (?P<size>\d+)")
# 0.10 API server: `vllm cache_config_info with initialization after num_gpu_blocks is: 5867`
BLOCKS_AFTER_INIT = re.compile(r"num_gpu_blocks is: (?P<blocks>\d+)")
# Failed starts state the capacity they found too short, and for what request length: V0 in tokens ("The model's
# max seq len (4096) is larger than ..."), V1 as memory needed vs available ("... max seq len (65536), (4.76 GiB").
V0_TOO_FEW_TOKENS = re.compile(
    r"(?:max seq len \((?P<length>\d+)\) is )?"
    r"larger than the maximum number of tokens that can be stored in KV cache \((?P<tokens>\d+)\)"
)
V1_TOO_LITTLE_MEMORY = re.compile(
    rf"(?:max seq len \((?P<length>\d+)\), )?"
    rf"\((?P<needed>{LOGGED_NUMBER}) GiB KV cache is needed, which is larger than the available KV cache memory "
    rf"\((?P<available>{LOGGED_NUMBER}) GiB\)"
)
# The attention backend's own account of the cache's element type, which the engine config's `kv_cache_dtype=auto`
# leaves to the checkpoint (a compressed-tensors `kv_cache_scheme` stores it in FP8): "FlashInfer resolved query
# dtypes: prefill=torch.bfloat16, ..., kv_cache_dtype=torch.float8_e4m3fn, arch=sm121".
RESOLVED_KV_DTYPE = re.compile(r"^FlashInfer resolved .*\bkv_cache_dtype=torch\.(?P<dtype>\w+)")
TORCH_KV_DTYPES = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "bfloat16": "bfloat16",
                   "float16": "float16", "float32": "float32"}
# What V1 prints when it builds its top-k/top-p sampler (vllm/v1/sample/ops/topk_topp_sampler.py): "Using
# FlashInfer for top-p & top-k sampling." or a fallback to the sort, "FlashInfer is not available. Falling back
# to the PyTorch-native implementation of top-p & top-k sampling. For the best performance, please install
# FlashInfer." (0.9.2 to 0.11.0), 0.8's "Currently, FlashInfer top-p & top-k sampling sampler is disabled because
# FlashInfer>=v0.2.3 is not backward compatible. Falling back to the PyTorch-native implementation of top-p & top-k
# sampling." or, with VLLM_USE_FLASHINFER_SAMPLER=0 before 0.11.1, "FlashInfer is available, but it is not enabled.
# Falling back to ..." (from 0.11.1 the fallback is logged at debug level only). The sampler sets
# the profile's activation peak, so the before-launch model takes it from here where a log states it.
TOP_K_TOP_P_SAMPLER = re.compile(r"(?P<flashinfer>Using FlashInfer for top-p & top-k sampling)"
                                 r"|(?P<pytorch>Falling back to the PyTorch-native implementation of top-p & top-k)")
# What a start that picked FlashInfer's attention prints (platforms/cuda.py): "Using FlashInfer backend on V1 engine."
# (read in 0.9.0 … 0.11.0), with FlashInfer imported: before 0.11.1 V1 then samples with it too unless told not to.
FLASHINFER_ATTENTION = re.compile(r"Using FlashInfer (?:MLA )?backend\b")
# What a start serving LoRA adapters prints when it builds their kernels' wrapper (lora/punica_wrapper): "Using
# PunicaWrapperGPU." (0.6.5 on; the platform's name ends it). The adapters' slots and the profile's dummy adapters
# take memory the before-launch model does not size.
LORA_WRAPPER = re.compile(r"^Using PunicaWrapper\w*")
NON_DEFAULT_ARGS = re.compile(r"^non-default args: (?P<args>\{.*\})\s*$")
ARGS_NAMESPACE = re.compile(r"^args: Namespace\((?P<args>.*)\)\s*$")  # before 0.10: every argument
NAMESPACE_NAME = re.compile(r"(?:^|, )(?P<name>[A-Za-z_]\w*)=")  # where each of its arguments begins
ENGINE_CONFIG = re.compile(
    r"^Initializing an? (?:(?P<generation>V\d) )?LLM engine \(v(?P<version>[^)]+)\) with config: (?P<config>.*)")
SERVER_VERSION = re.compile(r"^vLLM (?:API )?server version (?P<version>[^\s,]+)")
BANNER_VERSION = re.compile(r"█\s+version (?P<version>\d+\.\d+\S*)")
STARTING_TO_LOAD = re.compile(r"^Starting to load model")
# The GPU the engine names: the fused-MoE config it looks up (`E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3.json`,
# torch's device name with spaces as underscores), and the model config's warning on a GPU without bfloat16 (`Your
# device 'Tesla T4' (with compute capability 7.5) doesn't support torch.bfloat16`).
ENGINE_GPU_NAMES = (re.compile(r"device_name=(?P<name>NVIDIA_[A-Za-z0-9_-]{1,80}?)(?:,|\.json)"),
                    re.compile(r"Your device '(?P<name>[^']{1,80})' \(with compute capability"))
# A pasted nvidia-smi table's row (`|   0  NVIDIA A100-SXM4-40GB          On  |`): the machine's GPUs, of which
# the start may use any, so only a table whose rows all name one model names the start's.
SMI_GPU_ROW = re.compile(r"^\|\s+\d+\s+(?P<name>(?:NVIDIA|Tesla) [^|]{1,60}?)\s{2,}(?:On|Off)\s+\|")
# Lines a start prints once it has sized its cache: memory, blocks, tokens or concurrency.
SIZED_MARKERS = (KV_CACHE_SIZE, MAX_CONCURRENCY, BLOCKS, AVAILABLE_KV, V0_KV_REST, PROFILE_V06)
# Of those, the lines a process prints once a start: its own memory profile and the executor's block count. The
# token and concurrency lines are not among them: 0.9 and 0.10's engine prints one pair per rank.
ONCE_PER_PROCESS = (BLOCKS, AVAILABLE_KV, V0_KV_REST, PROFILE_V06)


class CpuKvSpace(pydantic.BaseModel):
    """The CPU build's own account of the memory it set aside for the KV cache: set explicitly or automatically
    per NUMA node (GiB, 2 decimals, 0.14 on), or its default of whole GiB (before 0.14, exact)."""

    mode: Literal["explicit", "auto", "default"]
    kv_cache_gib: float
    node_memory_gib: float | None = None
    numa_node: int | None = None

    @property
    def exact(self) -> bool:
        return self.mode == "default"


@dataclass
class StartFacts:
    """What one start's lines have said so far. Figures printed once per rank are kept per print."""

    found: dict[str, Any] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    concurrency: list[float] = field(default_factory=list)
    available: list[int] = field(default_factory=list)
    # each speaker's profile: V0's and Ray's workers share one process name and differ by pid
    profiles: dict[tuple[str | None, str | None], MemoryProfile] = field(default_factory=dict)
    by_rank: dict[int, int] = field(default_factory=dict)
    smi_rows: dict[str, str] = field(default_factory=dict)  # each GPU model a pasted nvidia-smi table names, its row
    stage: Stage = "starting"

    def read(self, line: LogLine) -> None:
        """Every sizing pattern the line matches counts; of the other facts, only the first that matches."""
        for pattern, read_sizing in SIZING_READERS:
            if match := pattern.search(line.message):
                read_sizing(self, match, line.process)
        for pattern, read_fact in FACT_READERS:
            if match := pattern.search(line.message):
                read_fact(self, match, line.process)
                return
        if profile := memory_profile_line(line.message, self.profiles.get(line.speaker)):
            self.profiles[line.speaker] = profile

    def starting_to_load(self, match: re.Match[str], process: str | None) -> None:
        self.stage = later_stage(self.stage, "loading_weights")

    def kv_cache_size(self, match: re.Match[str], process: str | None) -> None:
        self.found["kv_cache_device"] = match.group("device")
        self.tokens.append(logged_count(match.group("tokens")))
        self.stage = "after_kv_cache"

    def max_concurrency(self, match: re.Match[str], process: str | None) -> None:
        self.concurrency.append(logged_figure(match.group("times")))
        self.found["max_concurrency_model_len"] = logged_count(match.group("length"))
        self.stage = "after_kv_cache"

    def blocks(self, match: re.Match[str], process: str | None) -> None:
        self.found["kv_cache_device"] = self.found.get("kv_cache_device") or match.group("device")
        self.found["num_gpu_blocks"] = logged_count(match.group("device_blocks"))
        if match.group("cpu_blocks") is not None:
            self.found["num_cpu_blocks"] = logged_count(match.group("cpu_blocks"))
        self.stage = "after_kv_cache"

    def too_few_tokens(self, match: re.Match[str], process: str | None) -> None:
        self.found["kv_cache_tokens_at_failure"] = logged_count(match.group("tokens"))
        self._refused_request(match)

    def too_little_memory(self, match: re.Match[str], process: str | None) -> None:
        self.available.append(gib_to_bytes(match.group("available")))
        self.found["kv_cache_bytes_needed"] = gib_to_bytes(match.group("needed"))
        self._refused_request(match)

    def _refused_request(self, match: re.Match[str]) -> None:
        """The cache was sized and found short of one request: the weights are loaded, the profile ran."""
        self.stage = later_stage(self.stage, "sizing_kv_cache")
        if match.group("length") is not None:
            self.found.setdefault("max_model_len", logged_count(match.group("length")))

    def blocks_after_init(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("num_gpu_blocks", logged_count(match.group("blocks")))

    def available_kv(self, match: re.Match[str], process: str | None) -> None:
        self.available.append(gib_to_bytes(match.group("gib")))
        self.stage = later_stage(self.stage, "sizing_kv_cache")  # the profile ran: the weights are loaded
        if process and (rank := PROCESS_RANK.search(process)):
            self.by_rank[logged_count(rank.group("rank"))] = self.available[-1]

    def reserved_kv(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("reserved_kv_bytes", gib_to_bytes(match.group("gib")))
        self.stage = later_stage(self.stage, "sizing_kv_cache")  # the weights are loaded, the cache is being built

    def cpu_kv_space(self, match: re.Match[str], process: str | None) -> None:
        self.found["cpu_kv_space"] = CpuKvSpace(
            mode="explicit" if match.group("mode") == "Explicitly" else "auto",
            kv_cache_gib=logged_figure(match.group("kv_gib")),
            node_memory_gib=logged_figure(match.group("node_gib")),
            numa_node=logged_count(match.group("node")),
        )

    def cpu_kv_default(self, match: re.Match[str], process: str | None) -> None:
        space = CpuKvSpace(mode="default", kv_cache_gib=logged_count(match.group("kv_gib")))
        self.found.setdefault("cpu_kv_space", space)

    def model_loading(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("model_weights_bytes", gib_to_bytes(match.group("amount")))
        self.found.setdefault("model_loading_seconds", logged_figure(match.group("seconds")))
        self.stage = later_stage(self.stage, "sizing_kv_cache")

    def weights_memory(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("model_weights_bytes", gib_to_bytes(match.group("amount")))
        self.stage = later_stage(self.stage, "sizing_kv_cache")

    def weights_time(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("weights_loading_seconds", logged_figure(match.group("seconds")))
        self.stage = later_stage(self.stage, "sizing_kv_cache")

    def graph_capture(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("cuda_graph_seconds", logged_figure(match.group("seconds")))
        if match.group("gib") is not None:
            self.found.setdefault("cuda_graph_bytes", gib_to_bytes(match.group("gib")))

    def torch_compile(self, match: re.Match[str], process: str | None) -> None:
        self.found["torch_compile_seconds"] = logged_figure(match.group("seconds"))

    def init_engine(self, match: re.Match[str], process: str | None) -> None:
        self.found["init_seconds"] = logged_figure(match.group("seconds"))

    def max_model_len(self, match: re.Match[str], process: str | None) -> None:
        self.found["max_model_len"] = logged_count(match.group("length"))

    def batched_tokens(self, match: re.Match[str], process: str | None) -> None:
        self.found["max_num_batched_tokens"] = logged_count(match.group("tokens"))

    def context_parallel(self, match: re.Match[str], process: str | None) -> None:
        self.found["decode_context_parallel_size"] = logged_count(match.group("size"))

    def resolved_kv_dtype(self, match: re.Match[str], process: str | None) -> None:
        if dtype := TORCH_KV_DTYPES.get(match.group("dtype")):
            self.found["resolved_kv_cache_dtype"] = dtype

    def non_default_args(self, match: re.Match[str], process: str | None) -> None:
        self.found["non_default_args_text"] = match.group("args")
        self.found["non_default_args"] = _literal_dict(match.group("args"))

    def namespace_args(self, match: re.Match[str], process: str | None) -> None:
        self.found["non_default_args_text"] = match.group("args")
        self.found["non_default_args"] = _namespace_dict(match.group("args"))

    def engine_config(self, match: re.Match[str], process: str | None) -> None:
        self.found["engine_version"] = match.group("version")
        self.found["engine_generation"] = match.group("generation") or "V0"
        self.found.update(_engine_config_fields(match.group("config")))

    def server_version(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("engine_version", match.group("version"))

    def lora(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("lora_adapters_line", match.string)

    def engine_gpu(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("gpu_name", match.group("name").replace("_", " "))
        self.found.setdefault("gpu_name_line", match.string)

    def smi_gpu(self, match: re.Match[str], process: str | None) -> None:
        self.smi_rows.setdefault(match.group("name"), match.string)

    def flashinfer_attention(self, match: re.Match[str], process: str | None) -> None:
        self.found.setdefault("flashinfer_loaded_line", match.string)

    def sampler(self, match: re.Match[str], process: str | None) -> None:
        name = "flashinfer" if match.group("flashinfer") else "pytorch"
        if self.found.setdefault("top_k_top_p_sampler", name) != name:
            raise HarnessError("the log names both top-k/top-p samplers, FlashInfer's and PyTorch's, in one start: "
                               "the log is damaged or edited")
        self.found.setdefault("top_k_top_p_sampler_line", match.string)


Reader = Callable[[StartFacts, re.Match[str], str | None], None]
# Stage markers and the cache's size: a line may state several (one line carries tokens and concurrency).
SIZING_READERS: tuple[tuple[re.Pattern[str], Reader], ...] = (
    (STARTING_TO_LOAD, StartFacts.starting_to_load),
    (KV_CACHE_SIZE, StartFacts.kv_cache_size),
    (MAX_CONCURRENCY, StartFacts.max_concurrency),
    (BLOCKS, StartFacts.blocks),
    (V0_TOO_FEW_TOKENS, StartFacts.too_few_tokens),
    (V1_TOO_LITTLE_MEMORY, StartFacts.too_little_memory),
    (BLOCKS_AFTER_INIT, StartFacts.blocks_after_init),
)
# Facts a line states one at a time, tried in this order; a line none matches may be a memory profile's.
FACT_READERS: tuple[tuple[re.Pattern[str], Reader], ...] = (
    (AVAILABLE_KV, StartFacts.available_kv),
    (RESERVED_KV, StartFacts.reserved_kv),
    (CPU_KV_SPACE, StartFacts.cpu_kv_space),
    (CPU_KV_DEFAULT, StartFacts.cpu_kv_default),
    (MODEL_LOADING, StartFacts.model_loading),
    (WEIGHTS_MEMORY_V06, StartFacts.weights_memory),
    (WEIGHTS_TIME, StartFacts.weights_time),
    (GRAPH_CAPTURE, StartFacts.graph_capture),
    (TORCH_COMPILE, StartFacts.torch_compile),
    (INIT_ENGINE, StartFacts.init_engine),
    (MAX_MODEL_LEN, StartFacts.max_model_len),
    (BATCHED_TOKENS, StartFacts.batched_tokens),
    (CONTEXT_PARALLEL, StartFacts.context_parallel),
    (RESOLVED_KV_DTYPE, StartFacts.resolved_kv_dtype),
    (NON_DEFAULT_ARGS, StartFacts.non_default_args),
    (ARGS_NAMESPACE, StartFacts.namespace_args),
    (ENGINE_CONFIG, StartFacts.engine_config),
    (SERVER_VERSION, StartFacts.server_version),
    (BANNER_VERSION, StartFacts.server_version),
    (TOP_K_TOP_P_SAMPLER, StartFacts.sampler),
    (FLASHINFER_ATTENTION, StartFacts.flashinfer_attention),
    (LORA_WRAPPER, StartFacts.lora),
    *((pattern, StartFacts.engine_gpu) for pattern in ENGINE_GPU_NAMES),
    (SMI_GPU_ROW, StartFacts.smi_gpu),
)


SPECULATIVE_CONFIG = re.compile(r"speculative_config=SpeculativeConfig\((?P<body>[^)]*)\)")


def _optional(value: str) -> str | None:
    return None if value == "None" else value


# The engine config line's `name=value` fields read here: (the fact's name, the printed name, the value's
# pattern, how the value is kept).
ENGINE_CONFIG_FIELDS: tuple[tuple[str, str, str, Callable[[str], Any]], ...] = (
    ("model", "model", r"'(?P<value>[^']*)'", str),
    ("model_revision", "revision", r"(?P<value>[^,\s]+)", _optional),
    ("dtype", "dtype", r"(?:torch\.)?(?P<value>\w+)", str),
    ("kv_cache_dtype", "kv_cache_dtype", r"(?P<value>\w+)", str),
    ("quantization", "quantization", r"(?P<value>[\w-]+)", _optional),
    ("tensor_parallel_size", "tensor_parallel_size", r"(?P<value>\d+)", logged_count),
    ("pipeline_parallel_size", "pipeline_parallel_size", r"(?P<value>\d+)", logged_count),
    ("enforce_eager", "enforce_eager", r"(?P<value>True|False)", lambda value: value == "True"),
    ("config_max_seq_len", "max_seq_len", r"(?P<value>\d+)", logged_count),
    ("device", "device_config", r"(?P<value>\w+)", str),
)


def _engine_config_fields(config: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for field_name, printed, value, kept in ENGINE_CONFIG_FIELDS:
        if match := re.search(rf"(?:^|,\s+){printed}={value}", config):
            fields[field_name] = kept(match.group("value"))
    if match := SPECULATIVE_CONFIG.search(config):  # SpeculativeConfig(method='eagle3', model='…', num_spec_tokens=3)
        method = re.search(r"method='(?P<value>[\w-]+)'", match.group("body"))
        tokens = re.search(r"num_spec_tokens=(?P<value>\d+)", match.group("body"))
        fields["speculative_method"] = method.group("value") if method else "draft_model"  # 0.6-0.8: a draft model
        fields["speculative_tokens"] = logged_count(tokens.group("value")) if tokens else None
    return fields


def _namespace_dict(text: str) -> dict[str, Any] | None:
    """argparse's Namespace repr, `host=None, port=8000, limit_mm_per_prompt={'image': 1}, ...`: each argument whose
    value is a literal; one that is not (an object's repr, a value masked as a secret) is left out, alone."""
    names = list(NAMESPACE_NAME.finditer(text))
    if not names:
        return None
    arguments: dict[str, Any] = {}
    for name, following in zip(names, [*names[1:], None], strict=True):
        value = text[name.end():following.start() if following else len(text)]
        try:
            arguments[name.group("name")] = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return arguments


def _literal_dict(text: str) -> dict[str, Any] | None:
    """The args dict is a Python repr; values that are not literals (objects) leave only the raw text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
