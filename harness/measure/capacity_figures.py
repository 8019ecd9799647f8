"""capacity.json as figures: what the engine logged, what the memory model predicted, and the drift between.

A part of the figures contract (`harness.measure.figures`), kept apart because it reads the observe stage's
records (the capacity report, its drift check) rather than the run's own.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.observe.capacity_report import CapacityReport
from harness.observe.drift import DriftCheck
from harness.observe.engine_failure import Stage
from harness.observe.server_metrics import label_count


class _Figures(BaseModel):
    """A name a part does not declare is an error, not a figure that vanishes."""

    model_config = ConfigDict(extra="forbid")


class LoggedCapacity(_Figures):
    """What the engine's start-up log says it got; whether it started at all."""

    engine_started: bool | None = None
    kv_cache_tokens_logged: int | None = None
    max_concurrency_logged: float | None = None
    num_blocks_logged: int | None = None
    available_kv_cache_bytes_logged: int | None = None
    model_weights_bytes_logged: int | None = None
    engine_init_s: float | None = None
    engine_failure_stage: Stage | None = None
    engine_error: str | None = None


class PredictedCapacity(_Figures):
    """What the memory model predicted, and whether the log agreed."""

    kv_cache_tokens_predicted: int | None = None
    max_concurrency_predicted: float | None = None
    num_blocks_predicted: int | None = None
    prediction_matches_log: bool | None = None


class DriftFigures(_Figures):
    """The before-launch prediction for the run's engine against what it logged, per term (`observe.drift`)."""

    kv_cache_tokens_before_launch: int | None = None
    kv_cache_tokens_drift_share: float | None = None  # logged / before-launch − 1
    drift_term: str | None = None  # the term most likely off, when the drift is over its threshold
    weights_bytes_before_launch: int | None = None
    weights_bytes_logged: int | None = None
    activation_peak_bytes_before_launch: int | None = None
    activation_peak_bytes_logged: int | None = None
    non_torch_bytes_before_launch: int | None = None
    non_torch_bytes_logged: int | None = None
    cuda_graphs_bytes_before_launch: int | None = None
    cuda_graphs_bytes_logged: int | None = None
    kv_memory_bytes_before_launch: int | None = None
    kv_memory_bytes_logged: int | None = None

    @classmethod
    def of(cls, check: DriftCheck) -> DriftFigures:
        terms = {term.name: term for term in check.terms}

        def term(name: str) -> tuple[int | None, int | None]:
            found = terms.get(name)
            return (None, None) if found is None else (found.predicted_bytes, found.logged_bytes)

        weights, activation, non_torch = term("weights"), term("activation_peak"), term("non_torch")
        graphs, kv = term("cuda_graphs"), term("kv_memory")
        return cls(kv_cache_tokens_before_launch=check.kv_cache_tokens_predicted,
                   kv_cache_tokens_drift_share=check.kv_cache_tokens_drift_share, drift_term=check.term_off,
                   weights_bytes_before_launch=weights[0], weights_bytes_logged=weights[1],
                   activation_peak_bytes_before_launch=activation[0], activation_peak_bytes_logged=activation[1],
                   non_torch_bytes_before_launch=non_torch[0], non_torch_bytes_logged=non_torch[1],
                   cuda_graphs_bytes_before_launch=graphs[0], cuda_graphs_bytes_logged=graphs[1],
                   kv_memory_bytes_before_launch=kv[0], kv_memory_bytes_logged=kv[1])


class CapacityFigures(_Figures):
    """capacity.json's figures: logged and predicted KV capacity side by side, and the drift check."""

    logged: LoggedCapacity | None = None
    predicted: PredictedCapacity | None = None
    drift: DriftFigures | None = None
    drift_qualification: str | None = None  # joined to the summary's qualifications in the outputs

    @classmethod
    def of(cls, report: CapacityReport) -> CapacityFigures:
        log, prediction = report.log, report.prediction
        logged = None
        if log is not None:
            blocks = log.num_gpu_blocks  # V0 logs also print CPU blocks: swap space, not KV capacity
            if blocks is None and report.metrics_cache_config:
                blocks = label_count(report.metrics_cache_config.get("num_gpu_blocks")) or None
            logged = LoggedCapacity(
                engine_started=log.capacity_found, kv_cache_tokens_logged=log.kv_cache_tokens,
                max_concurrency_logged=log.max_concurrency, num_blocks_logged=blocks,
                available_kv_cache_bytes_logged=log.available_kv_cache_bytes or log.kv_cache_memory_bytes,
                model_weights_bytes_logged=log.model_weights_bytes, engine_init_s=log.init_seconds,
                engine_failure_stage=log.failure.stage if log.failure else None,
                engine_error=log.failure.error if log.failure else None)
        predicted = None if prediction is None else PredictedCapacity(
            kv_cache_tokens_predicted=prediction.kv_cache_tokens, max_concurrency_predicted=prediction.max_concurrency,
            num_blocks_predicted=prediction.num_blocks, prediction_matches_log=report.prediction_matches_log)
        drift = None if report.drift is None else DriftFigures.of(report.drift)
        return cls(logged=logged, predicted=predicted, drift=drift,
                   drift_qualification=None if report.drift is None else report.drift.qualification)

    def outputs(self) -> dict[str, Any]:
        return {**({} if self.logged is None else self.logged.model_dump(exclude_none=True)),
                **({} if self.predicted is None else self.predicted.model_dump(exclude_none=True)),
                **({} if self.drift is None else self.drift.model_dump(exclude_none=True))}
