"""A run record as a Polyaxon run, followed while it happens: inputs at the start, series during the load,
outputs and artifacts at the end.

Inputs and outputs are what the Polyaxon dashboard compares runs by, so their names are stable and carry
their units. Inside a managed run the record's id already is the run's UUID; offline, the record's id
becomes the offline run's UUID; a new run on an API gets the UUID the API assigns. Whichever it is, it is
written back into the record (`tracking.json`), and analysis joins on it.

Tracking starts before the engine does, so a run that times out or dies still shows its inputs and the
series up to then. Series carry a `live_` prefix: Polyaxon also shows a series' last value as an output,
and a last scrape (usually 0 waiting, 0 running once the load is over) must not read like a run's figure.
"""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.measure.record import RunConfig, ServerSample, read_samples
from harness.measure.stats import RunSummary
from harness.observe.capacity import CapacityReport
from harness.observe.device import DeviceRecord
from harness.observe.server_metrics import Histogram, MetricsSnapshot
from harness.polyaxon_client import managed_run_uuid, polyaxon_call
from harness.polyaxon_project import ProjectName, parse_project
from harness.redact import redact_text, secret_free
from harness.schema import EngineRecord, RunFile, TrackedRun
from harness.track.point_name import name_matrix_child

DEFAULT_PROJECT = "local/vllm-harness"
RECORD_FILES = (RunFile.CONFIG, RunFile.ENVIRONMENT, RunFile.ENGINE, RunFile.DEVICE, RunFile.SUMMARY, RunFile.CAPACITY,
                RunFile.REQUESTS_PARQUET, RunFile.SAMPLES, RunFile.ENGINE_LOG)
SERIES = {  # series name → MetricsSnapshot field; tracked as `live_<name>`
    "waiting_requests": "num_requests_waiting",
    "running_requests": "num_requests_running",
    "kv_cache_usage_fraction": "kv_cache_usage_fraction",
}
LIVE_PREFIX = "live_"


def live_name(series: str) -> str:
    """The tracked metric's name for a series (its last value lands in outputs under this name too)."""
    return f"{LIVE_PREFIX}{series}"


class LiveRun:
    """One Polyaxon run, followed from before the engine starts until the record is complete."""

    def __init__(self, run: Any, owner: str, project: str, offline_root: Path | None) -> None:
        self.run = run
        self.owner = owner
        self.project = project
        self.offline_root = offline_root
        self.step = 0
        self.stepping = threading.Lock()  # the memory monitor logs from its own thread
        self.previous: tuple[float, MetricsSnapshot] | None = None

    @classmethod
    def start(cls, config: RunConfig, limits: dict[str, Any], *, project: str, offline_root: Path | None = None,
              name: str | None = None) -> LiveRun:
        """Initialise tracking and log what is known before anything runs: the limits and the workload."""
        named = parse_project(project, "Polyaxon project")
        run = _init(named, config.run_id, offline_root, name)
        live = cls(run, run.owner or named.owner, run.project or named.name, offline_root)
        run.log_inputs(**run_inputs(config, limits))
        if managed_run_uuid():
            name_matrix_child(live.owner, live.project, run.run_uuid)
        return live

    def log_inputs(self, **inputs: Any) -> None:
        """Facts learnt while running (the device, the dtype the engine loaded), as filterable inputs."""
        inputs = {name: value for name, value in inputs.items() if value is not None}
        if inputs:
            self.run.log_inputs(**inputs)

    def on_sample(self, sample: ServerSample, when: datetime.datetime | None = None) -> None:
        """One /metrics scrape as series: gauges as read, counters and histograms as rates over the interval."""
        if sample.snapshot is None:
            return
        values = live_series(sample.snapshot, self.previous and (sample.t_s - self.previous[0], self.previous[1]))
        self.previous = (sample.t_s, sample.snapshot)
        if values:
            self.log_series(values, when)

    def log_series(self, values: dict[str, float], when: datetime.datetime | None = None) -> None:
        with self.stepping:
            self.run.log_metrics(step=self.step, timestamp=when or datetime.datetime.now(datetime.UTC),
                                 **{live_name(name): value for name, value in values.items()})
            self.step += 1

    def finish(self, run_dir: Path, *, failure: str | None = None) -> TrackedRun:
        """Outputs, inputs learnt since the start, the record's files; the run ends failed when it failed."""
        inputs, outputs = run_io(run_dir)
        self.run.log_inputs(**inputs)
        self.run.log_outputs(**outputs)
        self._log_record_files(run_dir)
        if failure is not None:
            self.run.log_failed(reason="HarnessRun", message=redact_text(failure)[:1000])
        self.run.end()
        tracked = TrackedRun(run_uuid=self.run.run_uuid, owner=self.owner, project=self.project,
                             offline_root=None if self.offline_root is None else str(self.offline_root))
        (run_dir / RunFile.TRACKING).write_text(tracked.model_dump_json(indent=2), encoding="utf-8")
        return tracked

    def _log_record_files(self, run_dir: Path) -> None:
        log_files(self.run, {file_name.replace(".", "-"): run_dir / file_name for file_name in RECORD_FILES})


def log_files(run: Any, files: dict[str, Path]) -> None:
    """Files already under the run's outputs are referenced, others copied; each under its own lineage name."""
    from polyaxon.schemas import V1ArtifactKind

    outputs_path = run.get_outputs_path()
    for name, path in files.items():
        if not path.exists():
            continue
        if outputs_path and path.resolve().is_relative_to(Path(outputs_path).resolve()):
            run.log_artifact_ref(path=str(path), kind=V1ArtifactKind.FILE, name=name)
        else:
            run.log_artifact(path=str(path), name=name, kind="file")


def track_report(markdown: Path, page: Path, runs_compared: int) -> None:
    """Inside a managed run (polyaxonfiles/report.yaml): the report as the run's artifacts, opened from the
    dashboard, and how many runs it compared."""
    from polyaxon import tracking

    run = tracking.init(track_code=False, track_env=False, track_logs=False, collect_resources=False)
    run.log_outputs(runs_compared=runs_compared)
    log_files(run, {"report-html": page, "report-md": markdown})
    run.end()


def track_run(run_dir: Path, *, project: str, offline_root: Path | None = None, name: str | None = None) -> TrackedRun:
    """Log a finished run record to Polyaxon (the API, or an offline root that `polyaxon ops push` accepts)."""
    config = RunConfig.model_validate_json(_read(run_dir / RunFile.CONFIG))
    engine = read_engine_record(run_dir)
    live = LiveRun.start(config, dict(engine.limits), project=project, offline_root=offline_root,
                         name=name)
    anchor = config.clock_zero_unix_s
    for sample in read_samples(run_dir):
        when = None if anchor is None else datetime.datetime.fromtimestamp(anchor + sample.t_s, datetime.UTC)
        live.on_sample(sample, when)
    return live.finish(run_dir)


def live_series(snapshot: MetricsSnapshot, previous: tuple[float, MetricsSnapshot] | None) -> dict[str, float]:
    """The series one scrape gives; `previous` is (seconds since, snapshot) of the scrape before it.

    Counters and histograms only mean something over an interval: output tokens per second, and each
    engine-side latency histogram's mean over the requests it observed in that interval, in ms.
    """
    values = {name: getattr(snapshot, field) for name, field in SERIES.items()}
    values = {name: float(value) for name, value in values.items() if value is not None}
    if previous is None or previous[0] <= 0:
        return values
    interval_s, before = previous
    if snapshot.generation_tokens_total is not None and before.generation_tokens_total is not None:
        values["output_tokens_per_s"] = (snapshot.generation_tokens_total - before.generation_tokens_total) / interval_s
    for field in (name for name in type(snapshot).model_fields if name.endswith("_seconds")):
        now, then = getattr(snapshot, field), getattr(before, field)
        if isinstance(now, Histogram) and isinstance(then, Histogram) and now.count > then.count:
            mean_s = (now.sum - then.sum) / (now.count - then.count)
            values[f"{field.removesuffix('_seconds')}_ms_mean"] = mean_s * 1000
    return values


def offline_tracking_env(offline_root: Path, project: str) -> dict[str, str]:
    """The environment that makes a `harness run` started as a local process track offline here."""
    return {"HARNESS_OFFLINE_ROOT": str(offline_root.resolve()), "HARNESS_PROJECT": project}


def run_io(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run record's Polyaxon inputs and outputs; analysis reads local records through this too.

    A run whose engine never started has no summary: its outputs then say so, with the engine's error.
    """
    config = RunConfig.model_validate_json(_read(run_dir / RunFile.CONFIG))
    engine = read_engine_record(run_dir)
    outputs: dict[str, Any] = {}
    if (run_dir / RunFile.SUMMARY).exists():
        outputs.update(run_outputs(RunSummary.model_validate_json(_read(run_dir / RunFile.SUMMARY))))
    if (run_dir / RunFile.CAPACITY).exists():
        outputs.update(capacity_outputs(CapacityReport.model_validate_json(_read(run_dir / RunFile.CAPACITY))))
    limits = dict(engine.limits)
    if engine.image_reference:  # the image is held fixed in a one-limit comparison like any limit
        limits["image"] = engine.image_reference
    if engine.container_image:  # the harness image built on it, by digest, when the job ran in one
        limits["container_image"] = engine.container_image
    if (run_dir / RunFile.DEVICE).exists():  # the device is held fixed too; its memory peaks are figures
        device = DeviceRecord.model_validate_json(_read(run_dir / RunFile.DEVICE))
        limits.update(device.inputs())
        outputs.update(device.outputs())
    return run_inputs(config, limits), secret_free(outputs)


def read_engine_record(run_dir: Path) -> EngineRecord:
    """engine.json, or an empty record for a run measured against a server it did not start."""
    path = run_dir / RunFile.ENGINE
    return EngineRecord.model_validate_json(_read(path)) if path.exists() else EngineRecord()


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


def run_outputs(summary: RunSummary) -> dict[str, Any]:
    """Every scalar of the summary, latency percentiles flattened to `ttft_ms_p99`-style names.

    The sample interval is a setting the run was given (an input of the components), not a figure: an
    output of the same name would shadow the input in the components' templates."""
    outputs: dict[str, Any] = {}
    for name, value in summary.model_dump(exclude={"latency", "errors_by_class", "error_fraction_by_class",
                                                   "invalid_reasons", "qualifications", "schema_version",
                                                   "run_id", "sample_interval_s", "prefix_cache",
                                                   "turns"}).items():
        if value is not None:
            outputs[name] = value
    if summary.prefix_cache is not None:  # one scalar each: a dashboard output holds no nested object
        outputs.update({f"prefix_cache_{name}": value for name, value in summary.prefix_cache.model_dump().items()
                        if value is not None})
    per_token = ("tpot_ms_", "itl_ms_")  # left out when the tokens came in bursts: they would read as per-token
    outputs.update({name: value for name, value in summary.latency.items() if value is not None
                    and (summary.per_token_latency_paced is not False or not name.startswith(per_token))})
    outputs.update({f"errors_{name}": count for name, count in summary.errors_by_class.items()})
    outputs.update({f"error_rate_{name}_fraction": share for name, share in summary.error_fraction_by_class.items()})
    outputs["invalid_reasons"] = "; ".join(summary.invalid_reasons)
    outputs["qualifications"] = "; ".join(summary.qualifications)
    return outputs


def capacity_outputs(report: CapacityReport) -> dict[str, Any]:
    """Logged and predicted KV capacity side by side; whether the engine started at all."""
    log, prediction = report.log, report.prediction
    figures: dict[str, Any] = {}
    if log is not None:
        blocks = log.num_gpu_blocks  # V0 logs also print CPU blocks: swap space, not KV capacity
        if blocks is None and report.metrics_cache_config:
            blocks = int(report.metrics_cache_config.get("num_gpu_blocks") or 0) or None
        figures.update(
            engine_started=log.capacity_found,
            kv_cache_tokens_logged=log.kv_cache_tokens,
            max_concurrency_logged=log.max_concurrency,
            num_blocks_logged=blocks,
            available_kv_cache_bytes_logged=log.available_kv_cache_bytes or log.kv_cache_memory_bytes,
            model_weights_bytes_logged=log.model_weights_bytes,
            engine_init_s=log.init_seconds,
            engine_failure_stage=log.failure.stage if log.failure else None,
            engine_error=log.failure.error if log.failure else None,
        )
    if prediction is not None:
        figures.update(
            kv_cache_tokens_predicted=prediction.kv_cache_tokens,
            max_concurrency_predicted=prediction.max_concurrency,
            num_blocks_predicted=prediction.num_blocks,
            prediction_matches_log=report.prediction_matches_log,
        )
    return {name: value for name, value in figures.items() if value is not None}


def _init(project: ProjectName, run_uuid: str, offline_root: Path | None, name: str | None) -> Any:
    from polyaxon import tracking

    quiet = dict(track_code=False, track_env=False, track_logs=False)  # Polyaxon has these already
    if managed_run_uuid():  # a managed run: Polyaxon already knows who we are; CPU, memory and GPU series
        return polyaxon_call("cannot join this managed Polyaxon run",
                             lambda: tracking.init(collect_resources=True, **quiet))
    # Outside the cluster the resources would be this machine's, not the engine's pod's. And a new run on
    # an API syncs through a sidecar thread that 2.18 closes twice at the end: the second close blocks
    # forever once that thread has died, which a run with resource collection on did here.
    offline_path = None if offline_root is None else str(offline_root.resolve() / "runs" / run_uuid)
    return polyaxon_call(
        f"cannot create a Polyaxon run in project '{project}'",
        lambda: tracking.init(owner=project.owner, project=project.name, run_uuid=run_uuid, is_new=True, name=name,
                              is_offline=offline_root is not None, artifacts_path=offline_path,
                              collect_resources=False, **quiet),
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        raise HarnessError(f"{path}: missing from the run record") from None
