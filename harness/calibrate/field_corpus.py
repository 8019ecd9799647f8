"""The field corpus: real vLLM start-up logs from public threads, each with its source and stated facts.

A case is one YAML file: where the log was published, what was cut, the facts the thread states
(release, model, GPU, parallel layout, limits) and the log lines themselves. The model's config.json
lives beside the cases, so every architecture number traces to a file, not to memory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from packaging.version import Version

from harness.errors import HarnessError, describe_validation_error
from harness.observe.server_logs import StartupCapacity, parse_startup_log
from harness.predict.architectures import MAX_TOKENS
from harness.predict.budget import MAX_MEMORY_GIB, MAX_TENSOR_PARALLEL_SIZE
from harness.predict.kv_bytes import resolve_kv_dtype
from harness.predict.speculative import SpeculativeDecoding

MODEL_SIZE = re.compile(r"\d+(?:\.\d+)?[BbMm]")
GPU_MEMORY_SIZE = re.compile(r"-\d+GB$")
# Parallel sizes a case may leave to its log, which states them (StartupCapacity's fields of the same names).
LOGGED_PARALLELISM = ("tensor_parallel_size", "decode_context_parallel_size")


Count = Annotated[int, pydantic.Field(ge=1, le=MAX_TOKENS)]


def _kv_dtype(name: str) -> str:
    """A dtype name the calculator prices ('auto', 'bfloat16', 'fp8', ...): a typo would drop its case silently."""
    try:
        resolve_kv_dtype(name, "bfloat16")
    except HarnessError as error:
        raise ValueError(str(error)) from None
    return name


def _release(text: str) -> str:
    Version(text)  # InvalidVersion is a ValueError: the case's file and field are named
    return text


DType = Annotated[str, pydantic.AfterValidator(_kv_dtype)]


class CaseFacts(pydantic.BaseModel, extra="forbid"):
    vllm_version: Annotated[str, pydantic.AfterValidator(_release)]
    # The pull request whose unreleased build printed the log: its memory accounting is that commit's, not the
    # release's, so the case is scored from its logged memory only
    development_build: pydantic.HttpUrl | None = None
    model: str
    config: str | None = pydantic.Field(None, pattern=r"^[^/\\]+\.json$")  # a file in configs/, nowhere else
    dtype: DType = "bfloat16"
    kv_cache_dtype: DType = "auto"
    quantization: str | None = None
    gpu: str | None = None
    gpu_total_gib: float | None = pydantic.Field(None, gt=0, le=MAX_MEMORY_GIB, allow_inf_nan=False)
    tensor_parallel_size: int = pydantic.Field(1, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    pipeline_parallel_size: int = pydantic.Field(1, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    decode_context_parallel_size: int = pydantic.Field(1, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    # unstated, the release's default (releases.py `gpu_memory_utilization`)
    gpu_memory_utilization: float | None = pydantic.Field(None, gt=0, le=1, allow_inf_nan=False)
    max_model_len: Count
    max_num_batched_tokens: Count | None = None
    max_num_seqs: Count | None = None
    block_size: Count = 16
    engine: Literal["V0", "V1"] | None = None  # when the release could run either
    sampler: Literal["flashinfer", "pytorch"] | None = None  # V1's top-k/top-p sampler as the thread states it
    enable_prefix_caching: bool = False  # as the arguments state it; what it changes is a hybrid's state blocks
    # LoRA served beside the model (`enable_lora`, vLLM's "Using PunicaWrapperGPU"): its adapter slots and the
    # profile's dummy adapters are not sized before launch, so such a start is scored from its logged memory only
    enable_lora: bool = False
    speculative: SpeculativeDecoding | None = None
    # --limit-mm-per-prompt as the thread's command gives it, where the log's own arguments line is not kept
    limit_mm_per_prompt: dict[Literal["image", "video"], Annotated[int, pydantic.Field(ge=0)]] | None = None
    started: bool = True
    failed_after_cache_sized: bool = False  # the cache held a full-length request; the start failed later
    # False where the excerpt leaves out what shares the cache (its KV dtype, a drafter's layers): its figures
    # cannot be scored against any prediction, so the case says why and is left out of the scores
    cache_contents_stated: bool = True


class FieldCase(pydantic.BaseModel, extra="forbid"):
    id: str
    source: pydantic.HttpUrl
    where: str
    edits: str
    facts: CaseFacts
    log: str = pydantic.Field(pattern=r"\S")  # an empty log would drop its case from the scores silently
    start: int | None = None  # which start (from 1) the case scores, where its log holds several

    @pydantic.model_validator(mode="before")
    @classmethod
    def _parallelism_from_the_log(cls, case: Any) -> Any:
        """A thread that does not state its tensor-parallel size leaves it to the log: its engine config line,
        else its workers' `TP<n>` prefixes, else one GPU. Its decode-context-parallel size likewise: the
        `dcp_world_size` line or the arguments, else none."""
        facts, log = (case.get("facts"), case.get("log")) if isinstance(case, dict) else (None, None)
        if not isinstance(facts, dict):
            return case
        unstated = [name for name in LOGGED_PARALLELISM if name not in facts]
        if unstated and isinstance(log, str) and log.strip():
            start = case.get("start")
            try:
                parsed = parse_startup_log(log, start if isinstance(start, int) else None)
            except HarnessError:
                parsed = None  # the start named is not in the log: the check below says so
            logged = {name: (getattr(parsed, name) if parsed else None) or 1 for name in unstated}
            case = {**case, "facts": {**facts, **logged}}
        return case

    @pydantic.model_validator(mode="after")
    def _one_start_named(self) -> FieldCase:
        starts = parse_startup_log(self.log).starts
        if starts > 1 and self.start is None:
            raise ValueError(f"the log holds {starts} starts: name the one the case scores with 'start:'")
        if self.start is not None and not 1 <= self.start <= starts:
            raise ValueError(f"'start: {self.start}' but the log holds {starts} start(s)")
        return self

    @pydantic.model_validator(mode="after")
    def _lora_as_the_log_shows(self) -> FieldCase:
        line = parse_startup_log(self.log, self.start).lora_adapters_line
        if line is not None and not self.facts.enable_lora:
            raise ValueError(f"the log serves LoRA adapters ({line!r}): state 'enable_lora: true' in its facts")
        return self

    def parsed(self) -> StartupCapacity:
        return parse_startup_log(self.log, self.start)

    def logged_sampler(self) -> tuple[str, str] | None:
        """(sampler, the first line naming it) when the log names V1's top-k/top-p sampler."""
        log = self.parsed()
        if log.top_k_top_p_sampler is None or log.top_k_top_p_sampler_line is None:
            return None
        return log.top_k_top_p_sampler, log.top_k_top_p_sampler_line

    @property
    def family(self) -> str:
        """`meta-llama/Llama-3.1-8B-Instruct` → `Llama-3.1`: the part of the name before the size."""
        parts = self.facts.model.split("/")[-1].split("-")
        sizes = [i for i, part in enumerate(parts) if i and MODEL_SIZE.fullmatch(part)]
        return "-".join(parts[: sizes[0]] if sizes else parts)

    @property
    def gpu_family(self) -> str:
        """`H100-80GB` → `H100`: the GPU named without its memory size; a case that states only a total says so."""
        if self.facts.gpu is not None:
            return GPU_MEMORY_SIZE.sub("", self.facts.gpu)
        return "a total only" if self.facts.gpu_total_gib is not None else "not stated"


def architecture(config: dict[str, Any] | None) -> str:
    """The model class vLLM loads, as the config's `architectures` names it first."""
    named = config.get("architectures") if config else None
    if isinstance(named, list) and named and isinstance(named[0], str):
        return named[0]
    return "no config" if config is None else "not named in the config"


def load_corpus(directory: Path) -> tuple[list[FieldCase], dict[str, dict[str, Any]]]:
    """Every `cases/*.yaml` under the directory, and the config.json files they name."""
    cases_dir, configs_dir = directory / "cases", directory / "configs"
    if not cases_dir.is_dir():
        raise HarnessError(f"{directory}: no cases/ directory of field cases")
    cases = [_load_case(path) for path in sorted(cases_dir.glob("*.yaml"))]
    if not cases:
        raise HarnessError(f"{cases_dir}: no *.yaml cases")
    configs: dict[str, dict[str, Any]] = {}
    for case in cases:
        name = case.facts.config
        if name and name not in configs:
            path = configs_dir / name
            try:
                configs[name] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError) as error:
                reason = error.strerror if isinstance(error, OSError) else type(error).__name__
                raise HarnessError(f"{path}: config named by case {case.id} cannot be read ({reason})") from None
            if not isinstance(configs[name], dict):
                raise HarnessError(f"{path}: config named by case {case.id} is not a JSON object")
    return cases, configs


def _load_case(path: Path) -> FieldCase:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise HarnessError(f"{path}: not a readable YAML case ({type(error).__name__})") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path}: expected a mapping")
    odd = sorted(str(key) for key in data if not isinstance(key, str) or key == "id")
    if odd:  # the case's id is its file name; every other key is a field name
        raise HarnessError(f"{path}: unexpected key {odd[0]!r} (the id is the file's name)")
    try:
        return FieldCase(id=path.stem, **data)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, path)) from None
