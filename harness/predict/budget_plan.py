"""`harness budget`'s question, answered: a live-token population's KV bytes, and what a KV budget holds.

The options are one model (`BudgetOptions`, the command's options with its defaults); a KV memory figure
comes one of three ways (as vLLM logged it, as reserved with --kv-cache-memory-bytes, or from a GPU's
total), and the assumptions each way makes are written beside the result.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from harness.errors import HarnessError
from harness.predict.budget import (
    BudgetResult,
    Population,
    available_kv_bytes_from_gpu,
    estimate_budget,
    predict_capacity,
)
from harness.predict.model_shape import ModelShape
from harness.predict.releases import engine_version_warnings
from harness.units import GiB


class BudgetOptions(BaseModel):
    """`harness budget`'s options for the forward budget and the capacity, one field each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int | None = None
    sequences: int = 1
    lengths: str | None = None
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    block_size: int = 16
    shared_prefix_tokens: int = 0
    hybrid_kv_manager: bool = True
    available_kv_gib: float | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float = 0.9
    overhead_gib: float = 0.0
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    engine_version: str | None = None


def plan_budget(shape: ModelShape, options: BudgetOptions) -> BudgetResult:
    """The forward budget, plus the capacity prediction when a KV memory figure is given one way or another."""
    _finite_positive("--available-kv-gib", options.available_kv_gib)
    _finite_positive("--gpu-memory-gib", options.gpu_memory_gib)
    if not (math.isfinite(options.overhead_gib) and options.overhead_gib >= 0):
        raise HarnessError(f"--overhead-gib must be a finite number ≥ 0, got {options.overhead_gib}")
    warnings = engine_version_warnings(options.engine_version)
    if options.lengths is not None:
        try:
            population = Population(sequence_tokens=[int(x) for x in options.lengths.split(",")],
                                    shared_prefix_tokens=options.shared_prefix_tokens)
        except ValueError:
            raise HarnessError(f"lengths must be comma-separated integers, got '{options.lengths}'") from None
    elif options.tokens is not None:
        population = Population.uniform(options.sequences, options.tokens, options.shared_prefix_tokens)
    else:
        raise HarnessError("give --tokens (with --sequences) or --lengths")
    result = estimate_budget(shape, population, kv_cache_dtype=options.kv_cache_dtype,
                             tensor_parallel_size=options.tensor_parallel_size, block_size=options.block_size,
                             hybrid_kv_manager=options.hybrid_kv_manager)
    sources = [x is not None for x in (options.available_kv_gib, options.kv_cache_memory_bytes, options.gpu_memory_gib)]
    if sum(sources) > 1:
        raise HarnessError("give only one of --available-kv-gib, --kv-cache-memory-bytes, --gpu-memory-gib")
    longest = shape.max_position_embeddings
    if options.max_model_len is not None and longest and options.max_model_len > longest:
        warnings.append(f"--max-model-len {options.max_model_len:,} is above the model's max_position_embeddings "
                        f"{shape.max_position_embeddings:,}: vLLM refuses it unless rope scaling or "
                        "VLLM_ALLOW_LONG_MAX_MODEL_LEN allows it")
    if options.available_kv_gib is not None:
        available = int(options.available_kv_gib * GiB)
        source = f"{options.available_kv_gib} GiB as logged by vLLM"
    elif options.kv_cache_memory_bytes is not None:
        available, source = options.kv_cache_memory_bytes, "--kv-cache-memory-bytes reservation"
    elif options.gpu_memory_gib is not None:
        if result.weights_bytes is None:
            raise HarnessError(f"{shape.name}: weights unknown, so --gpu-memory-gib cannot be turned into KV memory")
        overhead = int(options.overhead_gib * GiB)
        usable = int(options.gpu_memory_gib * GiB * options.gpu_memory_utilization)
        if result.weights_bytes + overhead > usable:
            warnings.append(f"the weights ({result.weights_bytes / GiB:.2f} GiB per GPU) and overhead do not fit "
                            f"in {options.gpu_memory_gib} GiB × {options.gpu_memory_utilization} = "
                            f"{usable / GiB:.2f} GiB: vLLM cannot start this model on this GPU (0 KV blocks)")
        available = available_kv_bytes_from_gpu(int(options.gpu_memory_gib * GiB), options.gpu_memory_utilization,
                                                 result.weights_bytes + overhead)
        source = (f"{options.gpu_memory_gib} GiB × {options.gpu_memory_utilization} − weights − "
                  f"{options.overhead_gib} GiB overhead"
                  + ("" if overhead else " (activation peak and non-torch memory not given: optimistic)"))
    else:  # no KV memory figure: the forward budget alone
        return result.model_copy(update={"warnings": warnings})
    model_len = options.max_model_len or shape.max_position_embeddings
    if model_len is None:
        raise HarnessError(f"{shape.name}: no max_position_embeddings in the config; give --max-model-len")
    capacity = predict_capacity(
        shape, available_kv_bytes=available, block_size=options.block_size, max_model_len=model_len,
        kv_cache_dtype=options.kv_cache_dtype, tensor_parallel_size=options.tensor_parallel_size,
        max_num_batched_tokens=options.max_num_batched_tokens, engine_version=options.engine_version,
        hybrid_kv_manager=options.hybrid_kv_manager, available_kv_source=source)
    return result.model_copy(update={"capacity": capacity, "warnings": warnings})


def _finite_positive(name: str, value: float | None) -> None:
    """nan, inf, zero and negative memory figures are bad input, not a budget."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise HarnessError(f"{name} must be a finite positive number of GiB, got {value}")


