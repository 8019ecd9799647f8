"""A run record as a Polyaxon run, followed while it happens: inputs at the start, series during the load,
outputs and artifacts at the end.

Inputs and outputs are what the Polyaxon dashboard compares runs by, so their names are stable and carry
their units. Inside a managed run the record's id already is the run's UUID; offline, the record's id
becomes the offline run's UUID; a new run on an API gets the UUID the API assigns. Whichever it is, it is
written back into the record (`tracking.json`), and analysis joins on it. What is logged at the end is the
record's figures contract (`measure.figures.RunFigures`), the same the analysis reads from a local record.

Tracking starts before the engine does, so a run that times out or dies still shows its inputs and the
series up to then. Series carry a `live_` prefix: Polyaxon also shows a series' last value as an output,
and a last scrape (usually 0 waiting, 0 running once the load is over) must not read like a run's figure.
"""

from __future__ import annotations

import datetime
import queue
import threading
from pathlib import Path
from typing import Any

from harness.measure.figures import SERIES, RunFigures, live_name, read_run_figures, run_inputs
from harness.measure.record import RunConfig, ServerSample
from harness.observe.server_metrics import Histogram, MetricsSnapshot
from harness.polyaxon_client import managed_run_uuid, polyaxon_call
from harness.polyaxon_project import ProjectName, parse_project
from harness.redact import redact_text
from harness.schema import RunFile, TrackedRun
from harness.track.point_name import name_matrix_child

DEFAULT_PROJECT = "local/vllm-harness"
RECORD_FILES = (RunFile.CONFIG, RunFile.ENVIRONMENT, RunFile.ENGINE, RunFile.DEVICE, RunFile.SUMMARY, RunFile.CAPACITY,
                RunFile.REQUESTS_PARQUET, RunFile.SAMPLES, RunFile.ENGINE_LOG)


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

    def finish(self, run_dir: Path, *, failure: str | None = None, figures: RunFigures | None = None) -> TrackedRun:
        """Outputs, inputs learnt since the start, the record's files; the run ends failed when it failed.
        `figures`: the record already read (a finished record tracked afterwards), else read now it is complete."""
        figures = figures or read_run_figures(run_dir)
        self.run.log_inputs(**figures.inputs())
        self.run.log_outputs(**figures.outputs())
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
    figures = read_run_figures(run_dir)
    live = LiveRun.start(figures.config, dict(figures.engine.limits), project=project, offline_root=offline_root,
                         name=name)
    anchor = figures.config.clock_zero_unix_s
    for sample in figures.samples:
        when = None if anchor is None else datetime.datetime.fromtimestamp(anchor + sample.t_s, datetime.UTC)
        live.on_sample(sample, when)
    return live.finish(run_dir, figures=figures)


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


def _init(project: ProjectName, run_uuid: str, offline_root: Path | None, name: str | None) -> Any:
    from polyaxon import tracking

    quiet = dict(track_code=False, track_env=False, track_logs=False)  # Polyaxon has these already
    if managed_run_uuid():  # a managed run: Polyaxon already knows who we are; CPU, memory and GPU series
        return polyaxon_call("cannot join this managed Polyaxon run",
                             lambda: tracking.init(collect_resources=True, **quiet))
    return new_run(project, run_uuid, offline_root, name)


def new_run(project: ProjectName, run_uuid: str, offline_root: Path | None, name: str | None) -> Any:
    """A new run in `project`: offline under `offline_root/runs/<uuid>`, or on the API when it is None."""
    from polyaxon import tracking

    # Outside the cluster the resources would be this machine's, not the engine's pod's; collecting them
    # also killed the API run's sync thread, whose end then hung (see unblock_sync_thread_close).
    offline_path = None if offline_root is None else str(offline_root.resolve() / "runs" / run_uuid)
    run = polyaxon_call(
        f"cannot create a Polyaxon run in project '{project}'",
        lambda: tracking.init(owner=project.owner, project=project.name, run_uuid=run_uuid, is_new=True, name=name,
                              is_offline=offline_root is not None, artifacts_path=offline_path,
                              collect_resources=False, track_code=False, track_env=False, track_logs=False),
    )
    unblock_sync_thread_close(run)
    return run


def unblock_sync_thread_close(run: Any) -> None:
    """Let the run's end return although its artifact-sync thread has died.

    Polyaxon's `SidecarThread` takes its shutdown signal through a queue of one; once the thread has died
    (an API error while syncing: a busy sandbox answered 405), a second signal waits forever for room, and
    the run's end hung a test run for good. An unbounded queue takes every signal; the thread reads the
    attribute on each pass, so a live one still gets its signal and syncs one last time.
    """
    sidecar = getattr(run, "_sidecar", None)
    if sidecar is not None and hasattr(sidecar, "_queue"):
        sidecar._queue = queue.Queue()
