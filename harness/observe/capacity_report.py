"""The capacity report's typed contract: what the calculator was given, each figure predicted against logged,
what the log and /metrics say of the same figure, and the report that holds them (built by `capacity.py`,
printed by `capacity_table.py`, recorded with every run)."""

from __future__ import annotations

import pydantic

from harness.observe.capacity_waterfall import WaterfallComparison
from harness.observe.drift import DriftCheck
from harness.observe.server_logs import StartupCapacity
from harness.predict.budget import CapacityPrediction
from harness.predict.speculative import SpeculativeDecoding

CAPACITY_SCHEMA_VERSION = 1
# The log's figures the report's table shows, in this order.
LOG_FIGURES = (
    "engine_version", "model", "quantization", "kv_cache_dtype", "kv_cache_device", "kv_cache_tokens",
    "max_concurrency", "max_concurrency_model_len",
    "max_model_len", "num_gpu_blocks", "num_cpu_blocks", "available_kv_cache_bytes", "kv_cache_memory_bytes",
    "model_weights_bytes", "model_loading_seconds", "cuda_graph_bytes", "init_seconds", "tensor_parallel_size",
    "pipeline_parallel_size", "decode_context_parallel_size", "speculative_method", "speculative_tokens",
)


class PredictionInputs(pydantic.BaseModel):
    """What the calculator was given, and where each input came from."""

    model: str
    available_kv_bytes: int
    available_kv_source: str
    available_kv_exact: bool
    block_size: int
    block_size_source: str
    max_model_len: int
    kv_cache_dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    stage_kv_bytes: list[int]  # each pipeline stage's KV memory; one stage holds the whole model
    max_num_batched_tokens: int | None
    engine_version: str | None
    speculative: SpeculativeDecoding | None = None  # the drafter the log names, whose layers join the cache
    decode_context_parallel_size: int = 1  # ranks one sequence's cache is spread over, as the log says


class ComparedFigure(pydantic.BaseModel):
    """One capacity figure, predicted and logged; `residual` is logged minus predicted."""

    name: str
    source: str
    predicted: int | float
    logged: int | float
    residual: int | float
    exact: bool
    within_log_rounding: bool | None = None


class CrossCheck(pydantic.BaseModel):
    """One figure as the log and /metrics state it."""

    name: str
    log_value: str
    metrics_value: str
    agree: bool


class CapacityReport(pydantic.BaseModel):
    """The engine's KV capacity from every source, side by side."""

    schema_version: int = CAPACITY_SCHEMA_VERSION
    log: StartupCapacity | None
    metrics_cache_config: dict[str, str] | None
    prediction_inputs: PredictionInputs | None
    prediction: CapacityPrediction | None
    prediction_note: str | None
    comparison: list[ComparedFigure]
    cross_checks: list[CrossCheck]
    disagreements: list[str]
    prediction_matches_log: bool | None  # every figure exact, or inside the rounding the log prints it with
    waterfall: WaterfallComparison | None = None
    drift: DriftCheck | None = None  # a recorded run's before-launch prediction against its logged capacity
    drift_note: str | None = None  # why a recorded run has no drift check


def shown_figure(value: float, sign: str = "") -> str:
    """A compared figure as the report writes it: whole numbers in full, with thousands separators (a 64-token
    difference in two million must show), others to six significant digits."""
    return f"{value:{sign},.0f}" if float(value).is_integer() else f"{value:{sign}.6g}"
