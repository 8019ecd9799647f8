"""`harness budget`'s question, answered: a live-token population's KV bytes, and what a KV budget holds.

The options are one model (`BudgetOptions`, the command's options with its defaults); a KV memory figure
comes one of three ways (as vLLM logged it, as reserved with --kv-cache-memory-bytes, or from a GPU's
total), and the assumptions each way makes are written beside the result.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from harness.errors import HarnessError, fields_rule, flag_of
from harness.predict.architectures import MAX_TOKENS
from harness.predict.budget import (
    BLOCK_SIZES,
    MAX_MEMORY_GIB,
    MAX_SEQUENCES,
    MAX_TENSOR_PARALLEL_SIZE,
    BudgetResult,
    CapacityPrediction,
    Population,
    available_kv_bytes_from_gpu,
    estimate_budget,
)
from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.engine_launch import EngineLaunch
from harness.predict.kv_bytes import resolve_kv_dtype
from harness.predict.model_shape import ModelShape
from harness.predict.pipeline import pipeline_stages, predict_pipeline_capacity
from harness.predict.releases import (
    PRODUCTION_ENGINE,
    check_engine_generation,
    engine_release,
    engine_version_warnings,
    gpu_memory_utilization,
)
from harness.predict.speculative import SpeculativeDecoding
from harness.units import GiB


def vllm_block_size(size: int) -> int:
    if size not in BLOCK_SIZES:
        raise ValueError(f"vLLM's block sizes are {', '.join(map(str, BLOCK_SIZES))}")
    return size


def sequence_lengths(lengths: object) -> object:
    """'600,900' → [600, 900]: ASCII digits only, so '１２' or '1_000' is not read as a number."""
    if not isinstance(lengths, str):
        return lengths
    parts = lengths.split(",")
    if not all(re.fullmatch(r"\s*[0-9]{1,15}\s*", part) and int(part) > 0 for part in parts):
        raise ValueError("must be comma-separated positive integers")
    return [int(part) for part in parts]


MAX_ITEMS_PER_PROMPT = 10_000  # vLLM bounds no modality's items a prompt; the profile's arithmetic wants a bound


class JsonObject(list[tuple[str, Any]]):
    """A JSON object as its (name, value) pairs, in order, so that a name given twice is seen."""


def items_per_prompt(limits: object) -> object:
    """vLLM's --limit-mm-per-prompt as typed: '{"image": 1, "video": 0}' (JSON, a modality also as
    '{"count": 1, ...}'), or 'image=1,video=0' (before 0.10); only images and videos are priced."""
    if not isinstance(limits, str):
        return limits
    example = "'{\"image\": 1, \"video\": 0}'"
    if limits.lstrip().startswith("{"):
        try:
            pairs: list[Any] = json.loads(limits, object_pairs_hook=JsonObject)
        except json.JSONDecodeError:
            raise ValueError(f"must be a JSON object such as {example}") from None
    else:
        pairs = [part.split("=") for part in limits.split(",")]
        if not all(len(pair) == 2 and re.fullmatch(r"\s*[0-9]{1,6}\s*", pair[1]) for pair in pairs):
            raise ValueError(f"must be 'image=N,video=N' or a JSON object such as {example}")
        pairs = [(key.strip(), int(value)) for key, value in pairs]
    counts = {key: dict(value).get("count") if isinstance(value, JsonObject) else value for key, value in pairs}
    if len(counts) < len(pairs):
        raise ValueError("names a modality twice")
    for key, count in counts.items():
        if key not in ("image", "video"):
            raise ValueError(f"'{key}' is not priced here (image, video)")
        if not (isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= MAX_ITEMS_PER_PROMPT):
            raise ValueError(f"{key} must be a whole number of items from 0 to {MAX_ITEMS_PER_PROMPT:,}")
    return counts


Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Gib = Annotated[float, Field(gt=0, le=MAX_MEMORY_GIB, allow_inf_nan=False)]
Named = Annotated[str, Field(min_length=1)]
ItemsPerPrompt = Annotated[dict[Literal["image", "video"], int], BeforeValidator(items_per_prompt)]


class BudgetOptions(BaseModel):
    """`harness budget`'s options, one field each, with the command's defaults and legal ranges: the one place
    a value is refused (`validate_options` names the option)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: Tokens | None = None
    sequences: int = Field(1, ge=1, le=MAX_SEQUENCES)
    lengths: Annotated[list[int], BeforeValidator(sequence_lengths)] | None = None  # '600,900' on the line
    kv_cache_dtype: Named = "auto"
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    decode_context_parallel_size: int = Field(1, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)  # spreads each sequence (MLA)
    pipeline_parallel_size: int = Field(1, ge=1, le=MAX_TENSOR_PARALLEL_SIZE)
    block_size: Annotated[int, AfterValidator(vllm_block_size)] = 16
    shared_prefix_tokens: int = Field(0, ge=0, le=MAX_TOKENS)
    hybrid_kv_manager: bool = True
    available_kv_gib: Gib | None = None
    kv_cache_memory_bytes: int | None = Field(None, ge=1, le=MAX_MEMORY_GIB * GiB)
    gpu_memory_gib: Gib | None = None
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)  # None: the release's
    overhead_gib: float = Field(0.0, ge=0, le=MAX_MEMORY_GIB, allow_inf_nan=False)
    max_model_len: Tokens | None = None
    max_num_batched_tokens: Tokens | None = None
    engine_version: Named | None = None
    engine: Literal["V0", "V1"] | None = None  # VLLM_USE_V1 as launched (0.8 to 0.10 run either); unset, the default
    max_num_seqs: int | None = Field(None, ge=1, le=MAX_SEQUENCES)  # read with --gpu and with --inventory
    concurrency: int | None = Field(None, ge=1, le=MAX_SEQUENCES)  # requests in flight, with --inventory
    num_gpu_blocks: int | None = Field(None, ge=2, le=MAX_TOKENS)  # as vLLM logs it, null block included
    kv_cache_tokens: Tokens | None = None  # "GPU KV cache size: N tokens" as vLLM logs it
    quantization: Named | None = None  # the before-launch answer's (--gpu)
    speculative: SpeculativeDecoding | None = None  # --speculative-method and --num-speculative-tokens
    enable_prefix_caching: bool = False  # what it changes is a hybrid's state blocks per request
    skip_mm_profiling: bool = False  # --skip-mm-profiling: no encoder profile (with --gpu)
    language_model_only: bool = False  # --language-model-only: no vision tower, no encoder profile (with --gpu)
    # --limit-mm-per-prompt: images and videos each dummy prompt of the encoder's profile carries (with --gpu)
    limit_mm_per_prompt: ItemsPerPrompt | None = None
    sampler: Literal["flashinfer", "pytorch"] | None = None  # V1's top-k/top-p sampler as installed (with --gpu)
    enforce_eager: bool = False  # vLLM's --enforce-eager: no CUDA graphs (with --gpu)

    @model_validator(mode="after")
    def one_population(self) -> BudgetOptions:
        """One population, whole: --tokens and --lengths are two answers to one question, and a shared prefix
        longer than a sequence cannot be shared by it."""
        if self.tokens is not None and self.lengths is not None:
            raise fields_rule("give {tokens} or {lengths}, not both", tokens="tokens", lengths="lengths")
        shortest = min(self.lengths) if self.lengths is not None else self.tokens
        if shortest is not None and self.shared_prefix_tokens > shortest:
            raise fields_rule(f"{{prefix}} {self.shared_prefix_tokens:,} is longer than the shortest sequence "
                              f"({shortest:,} tokens)", prefix="shared_prefix_tokens")
        return self

    @model_validator(mode="after")
    def batch_holds_the_sequences(self) -> BudgetOptions:
        """vLLM refuses a batch of fewer tokens than its sequences, when both are set ("max_num_batched_tokens (N)
        must be greater than or equal to max_num_seqs (M)", SchedulerConfig); a default max_num_seqs follows the
        batch down."""
        if self.max_num_batched_tokens is not None and self.max_num_seqs is not None \
                and self.max_num_batched_tokens < self.max_num_seqs:
            raise fields_rule(f"{{batch}} {self.max_num_batched_tokens:,} must be at least {{seqs}} "
                              f"{self.max_num_seqs:,}: vLLM refuses a batch smaller than its sequences",
                              batch="max_num_batched_tokens", seqs="max_num_seqs")
        return self

    @model_validator(mode="after")
    def context_within_tensor_parallel(self) -> BudgetOptions:
        """Decode context parallelism reuses the tensor-parallel ranks: vLLM needs it to divide their count."""
        if self.tensor_parallel_size % self.decode_context_parallel_size:
            raise fields_rule(f"{{dcp}} {self.decode_context_parallel_size} must divide {{tp}} "
                              f"{self.tensor_parallel_size}", dcp="decode_context_parallel_size",
                              tp="tensor_parallel_size")
        return self

    def unread_before_launch(self) -> list[str]:
        """The options `--gpu`'s answer does not read: it takes the KV memory from its own waterfall and
        answers for requests of --tokens (or max_model_len), so a KV figure or a population would be dropped."""
        defaults = BudgetOptions.model_fields
        unread = ("sequences", "lengths", "shared_prefix_tokens", "hybrid_kv_manager", "available_kv_gib",
                  "kv_cache_memory_bytes", "gpu_memory_gib", "overhead_gib", "concurrency", "num_gpu_blocks",
                  "kv_cache_tokens")
        return [flag_of(name) for name in unread if getattr(self, name) != defaults[name].default]

    def checked_engine(self) -> None:
        """--engine names an engine --engine-version (or the pinned image) has; checked where either answer starts."""
        check_engine_generation(engine_release(self.engine_version), self.engine)

    def engine_launch(self, shape: ModelShape) -> EngineLaunch:
        """The launch `--gpu` prices: these options as vLLM's flags, max_model_len the model's own when unset."""
        model_len = self.max_model_len or shape.max_position_embeddings
        if model_len is None:
            raise HarnessError(f"{shape.name}: no max_position_embeddings in the config; give --max-model-len")
        self.checked_engine()
        return EngineLaunch(
            engine_version=self.engine_version or PRODUCTION_ENGINE, engine_generation=self.engine,
            max_model_len=model_len,
            gpu_memory_utilization=self.gpu_memory_utilization, dtype_bytes=resolve_kv_dtype("auto", shape.dtype)[1],
            quantization=self.quantization, tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size, max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs, sampler=self.sampler, speculative=self.speculative,
            encoder=EncoderLaunch(skipped=self.skip_mm_profiling, language_model_only=self.language_model_only,
                                  image_limit=(self.limit_mm_per_prompt or {}).get("image"),
                                  video_limit=(self.limit_mm_per_prompt or {}).get("video")),
            enforce_eager=self.enforce_eager)


def plan_budget(shape: ModelShape, options: BudgetOptions) -> BudgetResult:
    """The forward budget, plus the capacity prediction when a KV memory figure is given one way or another."""
    warnings = engine_version_warnings(options.engine_version)
    options.checked_engine()
    unread = [flag_of(name) for name in ("max_num_seqs", "quantization", "skip_mm_profiling", "language_model_only",
                                         "limit_mm_per_prompt", "sampler", "enforce_eager")
              if getattr(options, name)]
    if unread:
        warnings.append(f"{' and '.join(unread)}: read only with --gpu (the before-launch answer); ignored here")
    result = estimate_budget(first_stage(shape, options.pipeline_parallel_size), _population(options),
                             kv_cache_dtype=options.kv_cache_dtype,
                             tensor_parallel_size=options.tensor_parallel_size, block_size=options.block_size,
                             hybrid_kv_manager=options.hybrid_kv_manager, engine_version=options.engine_version)
    capacity = plan_capacity(shape, options, result.weights_bytes, warnings)
    assumptions = result.assumptions
    if options.speculative is not None:
        assumptions = [*assumptions, "per-sequence bytes: the target model's layers alone; the drafter's "
                       "layers and wider state are in the capacity prediction"]
        if capacity is None:
            warnings.append("--speculative-method: read only with a KV memory figure (the capacity prediction) "
                            "or with --gpu; ignored here")
    if options.decode_context_parallel_size > 1 and capacity is None:
        warnings.append("--decode-context-parallel-size: read only with a KV memory figure (the capacity "
                        "prediction) or with --gpu; the per-rank bytes above hold whole sequences")
    return result.model_copy(update={"capacity": capacity, "warnings": warnings, "assumptions": assumptions})


def plan_capacity(shape: ModelShape, options: BudgetOptions, weights_bytes: int | None,
                  warnings: list[str]) -> CapacityPrediction | None:
    """What vLLM makes of the KV memory figure the options give (None when they give none); `weights_bytes` per
    rank, for a figure that is a GPU's total."""
    sources = [x is not None for x in (options.available_kv_gib, options.kv_cache_memory_bytes, options.gpu_memory_gib)]
    if sum(sources) > 1:
        raise HarnessError("give only one of --available-kv-gib, --kv-cache-memory-bytes, --gpu-memory-gib")
    longest = shape.max_position_embeddings
    if options.max_model_len is not None and longest and options.max_model_len > longest:
        warnings.append(f"--max-model-len {options.max_model_len:,} is above the model's max_position_embeddings "
                        f"{shape.max_position_embeddings:,}: vLLM refuses it unless rope scaling or "
                        "VLLM_ALLOW_LONG_MAX_MODEL_LEN allows it")
    kv_memory = _available_kv(shape, options, weights_bytes, warnings)
    if kv_memory is None:  # no KV memory figure: the forward budget alone
        return None
    available, source = kv_memory
    model_len = options.max_model_len or shape.max_position_embeddings
    if model_len is None:
        raise HarnessError(f"{shape.name}: no max_position_embeddings in the config; give --max-model-len")
    return predict_pipeline_capacity(
        shape, [available] * options.pipeline_parallel_size, block_size=options.block_size, max_model_len=model_len,
        kv_cache_dtype=options.kv_cache_dtype, tensor_parallel_size=options.tensor_parallel_size,
        max_num_batched_tokens=options.max_num_batched_tokens, engine_version=options.engine_version,
        engine_generation=options.engine,
        hybrid_kv_manager=options.hybrid_kv_manager, available_kv_source=source, speculative=options.speculative,
        prefix_caching=options.enable_prefix_caching, decode_context_parallel_size=options.decode_context_parallel_size)


def first_stage(shape: ModelShape, pipeline_parallel_size: int) -> ModelShape:
    """What one GPU of the first (largest) pipeline stage holds: its layers, and its share of the weights."""
    if pipeline_parallel_size == 1:
        return shape
    weights = None if shape.weights_bytes is None else math.ceil(shape.weights_bytes / pipeline_parallel_size)
    return pipeline_stages(shape, pipeline_parallel_size)[0].model_copy(update={"weights_bytes": weights})


def _population(options: BudgetOptions) -> Population:
    """The live sequences the budget is for: listed lengths, or N sequences of T tokens."""
    if options.lengths is not None:
        return Population(sequence_tokens=options.lengths,
                          shared_prefix_tokens=options.shared_prefix_tokens)
    if options.tokens is not None:
        return Population.uniform(options.sequences, options.tokens, options.shared_prefix_tokens)
    raise HarnessError("give --tokens (with --sequences) or --lengths")


def _available_kv(
    shape: ModelShape, options: BudgetOptions, weights_bytes: int | None, warnings: list[str]
) -> tuple[int, str] | None:
    """(KV bytes, where the figure came from) from whichever KV memory option was given; None when none was."""
    if options.available_kv_gib is not None:
        return int(options.available_kv_gib * GiB), f"{options.available_kv_gib} GiB as logged by vLLM"
    if options.kv_cache_memory_bytes is not None:
        return options.kv_cache_memory_bytes, "--kv-cache-memory-bytes reservation"
    if options.gpu_memory_gib is not None:
        return _available_kv_from_gpu(shape, options, options.gpu_memory_gib, weights_bytes, warnings)
    return None


def _available_kv_from_gpu(
    shape: ModelShape, options: BudgetOptions, gpu_memory_gib: float, weights_bytes: int | None, warnings: list[str]
) -> tuple[int, str]:
    """vLLM's own budget on a GPU of that size: its share of the memory, less the weights and the overhead."""
    if weights_bytes is None:
        raise HarnessError(f"{shape.name}: weights unknown, so --gpu-memory-gib cannot be turned into KV memory")
    overhead = int(options.overhead_gib * GiB)
    utilization = gpu_memory_utilization(options.gpu_memory_utilization, engine_release(options.engine_version))
    usable = int(gpu_memory_gib * GiB * utilization)
    if weights_bytes + overhead > usable:
        warnings.append(f"the weights ({weights_bytes / GiB:.2f} GiB per GPU) and overhead do not fit "
                        f"in {gpu_memory_gib} GiB × {utilization} = "
                        f"{usable / GiB:.2f} GiB: vLLM cannot start this model on this GPU (0 KV blocks)")
    available = available_kv_bytes_from_gpu(int(gpu_memory_gib * GiB), utilization, weights_bytes + overhead)
    source = (f"{gpu_memory_gib} GiB × {utilization} − weights − "
              f"{options.overhead_gib} GiB overhead"
              + ("" if overhead else " (activation peak and non-torch memory not given: optimistic)"))
    return available, source
