"""The figures contract: what a run record gives, read from its directory once, as typed models.

`RunSummary` (summary.json) is made of small parts, each computed by one module and each refusing a name
it does not declare: the client's health and the cost of its scrapes (`measure.stats`), how the tokens
were paced (`measure.stream_pacing`), where the engine spent the time (`measure.engine_time`) and the
server's peaks (`measure.stats`), prefix-cache reuse, predicted against measured and per conversation
turn (`measure.reuse_figures`), and the live-token population predicted for the run's load beside the peak
it measured (`measure.population_figures`). `RunFigures` is one record as the dashboard and the analysis see it:
what was asked, the engine, the summary, the captured capacity (`measure.capacity_figures`) and the device.
Its `inputs()` and `outputs()` are the names Polyaxon stores; `output_names()` is every name an output can
have, which the tests hold against `harness.schema.Output` and the components' declared outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import HarnessError
from harness.measure.capacity_figures import CapacityFigures, DriftFigures, LoggedCapacity, PredictedCapacity
from harness.measure.client import ErrorClass
from harness.measure.record import RunConfig, ServerSample, read_run_config, read_samples
from harness.measure.reuse_models import PrefixCacheFigures
from harness.measure.reuse_models import TurnFigures as TurnFigures  # re-exported: the analysis reads it here
from harness.observe.capacity_report import CapacityReport
from harness.observe.device import DeviceFacts, DeviceRecord
from harness.redact import secret_free
from harness.schema import EngineRecord, RunFile, TrackedRun

SUMMARY_SCHEMA_VERSION = 2  # 2: the figures are grouped in their parts
PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e", "dispatch_lag", "send_delay")  # each `<name>_ms_<stat>` in `latency`
PER_TOKEN_LATENCIES = ("tpot", "itl")  # left out of the outputs when the tokens came in bursts
RUNNING_SERIES = "running_requests"
SERIES = {  # series name → MetricsSnapshot field; tracked as `live_<name>`
    "waiting_requests": "num_requests_waiting",
    RUNNING_SERIES: "num_requests_running",
    "kv_cache_usage_fraction": "kv_cache_usage_fraction",
}
LIVE_PREFIX = "live_"
POPULATION_PREFIX = "population_"  # the population's outputs: `live_` names the tracked series
QUALIFICATIONS = "qualifications"
FileModel = TypeVar("FileModel", bound=BaseModel)


class Figures(BaseModel):
    """A part of the contract: a name it does not declare is an error, not a figure that vanishes."""

    model_config = ConfigDict(extra="forbid")


class ClientHealth(Figures):
    """The client's own lateness: its sampler's gaps and its event loop's."""

    sample_gap_s_max: float | None = None
    loop_lag_ms_p99: float | None = None
    loop_lag_ms_max: float | None = None
    loop_stall_share: float | None = None


class ScrapeCost(Figures):
    """How long the server spent answering this run's /metrics scrapes."""

    scrape_ms_mean: float | None = None
    scrape_share: float | None = None


class StreamPacing(Figures):
    """Whether the tokens reached the client one by one or in bursts."""

    burst_token_fraction: float | None = None
    arrival_instants_per_token: float | None = None
    largest_burst_tokens: int | None = None
    requests_burst_delivered: int | None = None
    per_token_latency_paced: bool | None = None
    # the longest time no token reached any stream while one had started and not ended (`stream_pacing`)
    stream_silence_s_max: float | None = None
    stream_silence_at_s: float | None = None  # when it began, on the run's clock
    server_went_silent: bool | None = None  # the silence was long enough to be the server's stop


class EngineTime(Figures):
    """Where the requests spent their time by the engine's histograms, beside what the client saw."""

    engine_queue_ms_mean: float | None = None
    engine_prefill_ms_mean: float | None = None
    engine_decode_ms_mean: float | None = None
    engine_ttft_ms_mean: float | None = None
    engine_itl_ms_mean: float | None = None
    engine_e2e_ms_mean: float | None = None
    engine_requests_finished: int | None = None
    engine_waiting_requests_mean: float | None = None
    engine_running_requests_mean: float | None = None
    client_e2e_ms_mean: float | None = None
    frontend_ms_mean: float | None = None
    frontend_share: float | None = None


class ServerFigures(Figures):
    """Peaks of the server's gauges and growth of its counters over the run's scrapes."""

    peak_waiting_requests: int | None = None
    peak_kv_cache_usage_fraction: float | None = None
    preemptions_during_run: int | None = None
    prefix_cache_hits_during_run_tokens: int | None = None


class PopulationFigures(Figures):
    """The block-padded live-token population `predict.population` gives for the run's load: `concurrency`
    requests drawn from the inventory (prompt + output cap each, as sent), capped at `max_num_seqs`, held
    against the engine's usable blocks, beside the peak KV usage the run's scrapes saw, in tokens. The
    prediction counts each request's blocks whole; with prefix caching on, blocks requests share are held
    once, so the measured peak may sit below it, and a peak between scrapes is missed."""

    concurrency: int = Field(description="requests the client keeps in flight")
    max_num_seqs: int | None = Field(description="the engine's, when the run knew it; None: none taken")
    live_requests: int = Field(description="concurrency capped at max_num_seqs")
    block_size_tokens: int
    usable_blocks: int = Field(description="vllm:cache_config_info's num_gpu_blocks less the null block")
    padded_tokens_p50_predicted: int
    padded_tokens_p99_predicted: int
    padded_tokens_max_predicted: int
    fit_share_predicted: float = Field(description="share of the draws whose blocks fit the usable blocks")
    draws: int
    seed: int
    peak_tokens_measured: int | None = Field(description="peak_kv_cache_usage_fraction of the usable blocks, "
                                             "in tokens; None: no scrape gave the usage")

    def outputs(self) -> dict[str, Any]:
        """Each figure under its dashboard name `population_<name>`."""
        return {f"{POPULATION_PREFIX}{name}": value for name, value in self.model_dump(exclude_none=True).items()}

    @classmethod
    def output_names(cls) -> set[str]:
        return {f"{POPULATION_PREFIX}{name}" for name in cls.model_fields}


PARTS = ("health", "scrape", "pacing", "engine", "server")  # RunSummary's parts, flattened into the outputs
# Kept out of the outputs: lists and mappings (flattened below), the record's bookkeeping, and the sample
# interval, a setting the run was given: an output of that name would shadow the input in the templates.
NOT_OUTPUTS = {"latency", "errors_by_class", "error_fraction_by_class", "invalid_reasons", "qualifications",
               "schema_version", "run_id", "sample_interval_s", "prefix_cache", "turns", "population", *PARTS}


class RunSummary(Figures):
    """summary.json: every figure names its unit; `latency` keys read like `ttft_ms_p99`."""

    schema_version: int = SUMMARY_SCHEMA_VERSION
    run_id: str | None = None  # the config's: a reader refuses a folder whose files disagree
    requests_sent: int
    requests_measured: int
    requests_ok: int
    errors_by_class: dict[str, int]
    error_fraction_by_class: dict[str, float] = {}
    error_rate_fraction: float = 0.0
    max_error_fraction: float | None = None  # the threshold the run was judged by
    window_s: float
    latency: dict[str, float | None]
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens_per_s: float
    chunks_per_s: float
    goodput_requests_per_s: float | None
    slo_attainment_share: float | None = None  # measured requests meeting every limit set (failed ones do not)
    # 1 when slo_attainment_share reached the target share, 0 when not: a number, so that Polyaxon's metric
    # early stopping can compare it (a JSON false does not order below 0 in PostgreSQL)
    slo_met: int | None = None
    offered_requests_per_s: float | None
    achieved_dispatch_per_s: float
    offered_concurrency: int | None
    achieved_concurrency_mean: float
    failed_scrapes: int
    sample_interval_s: float | None = None
    prompt_token_mismatches: int
    valid: bool
    invalid_reasons: list[str]
    qualifications: list[str] = []  # figures that stand, but not for what their names say
    stopped_by_signal: str | None = None
    health: ClientHealth
    scrape: ScrapeCost
    pacing: StreamPacing
    engine: EngineTime
    server: ServerFigures
    prefix_cache: PrefixCacheFigures | None = None  # None: a record from before prefix-cache figures
    turns: list[TurnFigures] = []  # one per turn number of the run's conversations; tracked in the summary only
    population: PopulationFigures | None = None  # None: an uncapped open loop, no cache geometry, or an older record

    def outputs(self) -> dict[str, Any]:
        """Every scalar figure under its dashboard name, latency percentiles flattened to `ttft_ms_p99`."""
        outputs = {name: value for name, value in self.model_dump(exclude=NOT_OUTPUTS).items() if value is not None}
        for part in PARTS:
            outputs.update(getattr(self, part).model_dump(exclude_none=True))
        if self.prefix_cache is not None:
            outputs.update(self.prefix_cache.outputs())
        if self.population is not None:
            outputs.update(self.population.outputs())
        per_token = tuple(f"{name}_ms_" for name in PER_TOKEN_LATENCIES)  # they would read as per-token figures
        outputs.update({name: value for name, value in self.latency.items() if value is not None
                        and (self.pacing.per_token_latency_paced is not False or not name.startswith(per_token))})
        outputs.update({f"errors_{name}": count for name, count in self.errors_by_class.items()})
        outputs.update({f"error_rate_{name}_fraction": share for name, share in self.error_fraction_by_class.items()})
        outputs["invalid_reasons"] = "; ".join(self.invalid_reasons)
        outputs[QUALIFICATIONS] = "; ".join(self.qualifications)
        return outputs


class RunFigures(Figures):
    """One run record as it was left: what was asked, the engine, and whatever figures the run got to."""

    config: RunConfig
    tracked: TrackedRun | None  # the Polyaxon run the record became, once it was tracked
    engine: EngineRecord
    summary: RunSummary | None  # None: the engine never started, or the run was cut short
    capacity: CapacityFigures | None
    device: DeviceRecord | None
    samples: list[ServerSample]

    @property
    def run_uuid(self) -> str:
        """The tracked run's UUID when the record was tracked, else the record's own id (equal outside managed
        runs)."""
        return self.config.run_id if self.tracked is None else self.tracked.run_uuid

    def inputs(self) -> dict[str, Any]:
        """The engine's limits (the image and the device held fixed like any limit) and the workload."""
        limits = dict(self.engine.limits)
        if self.engine.image_reference:
            limits["image"] = self.engine.image_reference
        if self.engine.container_image:  # the harness image built on it, by digest, when the job ran in one
            limits["container_image"] = self.engine.container_image
        if self.device is not None:
            limits.update(self.device.inputs())
        return run_inputs(self.config, limits)

    def outputs(self) -> dict[str, Any]:
        """A run whose engine never started has no summary: its outputs then say so, with the engine's error."""
        outputs: dict[str, Any] = {}
        if self.summary is not None:
            outputs.update(self.summary.outputs())
        if self.capacity is not None:
            outputs.update(self.capacity.outputs())
            if self.capacity.drift_qualification:  # a qualification of the run like the summary's own
                outputs[QUALIFICATIONS] = "; ".join(filter(None, (outputs.get(QUALIFICATIONS),
                                                                  self.capacity.drift_qualification)))
        if self.device is not None:  # its memory peaks are figures
            outputs.update(self.device.outputs())
        return secret_free(outputs)


def read_run_figures(run_dir: Path) -> RunFigures:
    """Every file of the record that holds figures, each parsed once; a missing config.json is one line."""
    config = read_run_config(run_dir)
    capacity = _model(run_dir / RunFile.CAPACITY, CapacityReport)
    return RunFigures(
        config=config, tracked=_model(run_dir / RunFile.TRACKING, TrackedRun),
        engine=_model(run_dir / RunFile.ENGINE, EngineRecord) or EngineRecord(),
        summary=_model(run_dir / RunFile.SUMMARY, RunSummary),
        capacity=None if capacity is None else CapacityFigures.of(capacity),
        device=_model(run_dir / RunFile.DEVICE, DeviceRecord), samples=read_samples(run_dir))


def _model(path: Path, model: type[FileModel]) -> FileModel | None:
    """The file as its model; None when the record has no such file. A damaged one raises ValidationError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise HarnessError(f"{path}: unreadable ({error.strerror})") from None
    except UnicodeDecodeError:
        raise HarnessError(f"{path}: not UTF-8 text; the record is damaged") from None
    return model.model_validate_json(text)


def run_inputs(config: RunConfig, limits: dict[str, Any]) -> dict[str, Any]:
    """The engine's limits and the workload: what a one-limit comparison holds fixed or varies. A secret is
    neither, and is left out (a record written before secrets were masked may still hold one)."""
    load = config.load
    workload = {
        "inventory_digest": config.inventory_digest,
        "concurrency": load.concurrency,
        "rate_per_s": load.rate_per_s,
        "burstiness": load.burstiness,
        "max_concurrency": load.max_concurrency,
        "requests": load.requests,
        "duration_s": load.duration_s,
        "warmup_requests": load.warmup_requests,
        "seed": load.seed,
        "order": load.order,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "cold": config.cold,
        "service_uuid": config.service_uuid,
    }
    return secret_free({name: value for name, value in {**limits, **workload}.items() if value is not None})


def live_name(series: str) -> str:
    """The tracked metric's name for a series (its last value lands in outputs under this name too)."""
    return f"{LIVE_PREFIX}{series}"


def latency_names(name: str) -> list[str]:
    """mean, each percentile and max of one latency, as `latency` keys them."""
    return [f"{name}_ms_mean", *(f"{name}_ms_p{p}" for p in PERCENTILES), f"{name}_ms_max"]


def output_names() -> set[str]:
    """Every output name a record can give: the summary's scalars and parts, its prefix-cache figures, its
    latencies and error classes, the capacity's and the device's figures."""
    scalars = set(RunSummary.model_fields) - NOT_OUTPUTS | {"invalid_reasons", "qualifications"}
    parts = (ClientHealth, ScrapeCost, StreamPacing, EngineTime, ServerFigures, LoggedCapacity, PredictedCapacity,
             DriftFigures)
    errors = {name for error in ErrorClass for name in (f"errors_{error}", f"error_rate_{error}_fraction")}
    return (scalars | {name for part in parts for name in part.model_fields} | errors
            | PrefixCacheFigures.output_names() | PopulationFigures.output_names()
            | {key for name in LATENCIES for key in latency_names(name)}
            | set(DeviceRecord.model_fields) - set(DeviceFacts.model_fields))

