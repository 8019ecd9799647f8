"""Read runs from wherever they were kept: plain run directories, a Polyaxon offline root, or the API.

Every source yields the same thing per run: its UUID, the inputs and outputs the Polyaxon dashboard
shows (`harness.measure.figures.RunFigures` for local records, the same the tracking logs, so there is one
schema), and the server's metric
series over time. Nothing here interprets the figures. A run directory also gives its conversations'
per-turn figures, which the summary holds and no output does (a list per run is no dashboard column).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from harness.errors import HarnessError, describe_validation_error
from harness.measure.figures import SERIES, RunFigures, TurnFigures, live_name, read_run_figures
from harness.measure.record import check_run_files
from harness.paths import input_directory
from harness.polyaxon_client import polyaxon_call, quiet_polyaxon
from harness.polyaxon_project import ProjectName, parse_project
from harness.schema import RunFile

SERIES_NAMES = tuple(SERIES)
# What each record model is read from, so a validation error can name its file.
MODEL_FILES = {"RunConfig": RunFile.CONFIG, "RunSummary": RunFile.SUMMARY, "CapacityReport": RunFile.CAPACITY,
               "ServerSample": RunFile.SAMPLES, "TrackedRun": RunFile.TRACKING, "EngineRecord": RunFile.ENGINE,
               "DeviceRecord": RunFile.DEVICE}
# config.json alone is also a model's or an inventory's; a run record has one of these beside it.
RUN_MARKERS = (RunFile.SUMMARY, RunFile.ENGINE, RunFile.CAPACITY, RunFile.REQUESTS)
OFFLINE_RUN_FILE = "run.plx.json"
DEFAULT_API_LIMIT = 100
# A run's UUID names the files the report writes for it (series-<uuid>.png), so it is a plain name.
PLAIN_UUID = re.compile(r"^(?!.*\.\.)[A-Za-z0-9_-][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class SourcedRun:
    """One run as any source gives it; `series` has `t_s` and one column per metric series."""

    run_uuid: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    series: pd.DataFrame
    origin: str
    turns: list[TurnFigures] = field(default_factory=list)  # per turn number, from a run directory's summary


def runs_from_directories(roots: Sequence[Path]) -> list[SourcedRun]:
    """Every run record under the given directories, searched recursively."""
    runs = []
    for root in roots:
        input_directory(root, "--runs")
        for config in sorted(root.rglob(RunFile.CONFIG)):
            in_offline_run = any((parent / "run.plx.json").exists() for parent in config.parents)
            if not in_offline_run and any((config.parent / marker).exists() for marker in RUN_MARKERS):
                runs.append(read_run_directory(config.parent))  # an offline run's artifacts are copies
    return runs


def read_run_directory(run_dir: Path) -> SourcedRun:
    """One record, read once as `RunFigures`; a malformed, truncated or mixed file is one line naming it."""
    check_run_files(run_dir)
    try:
        figures = read_run_figures(run_dir)
    except ValidationError as error:
        source = run_dir / MODEL_FILES.get(error.title, error.title)
        raise HarnessError(describe_validation_error(error, source)) from None
    uuid_source = run_dir / (RunFile.CONFIG if figures.tracked is None else RunFile.TRACKING)
    return SourcedRun(run_uuid=plain_uuid(figures.run_uuid, uuid_source), inputs=figures.inputs(),
                      outputs=figures.outputs(), series=_samples_frame(figures), origin=str(run_dir),
                      turns=[] if figures.summary is None else figures.summary.turns)


def plain_uuid(run_uuid: str, source: str | Path) -> str:
    """`run_uuid` when it can name a file: one with '/' or '..' in it would put the report's files elsewhere."""
    if not PLAIN_UUID.match(run_uuid):
        raise HarnessError(f"{source}: run id {run_uuid!r} is not a plain name (letters, digits, '_', '-', '.'); "
                           "the record is damaged")
    return run_uuid


def _samples_frame(figures: RunFigures) -> pd.DataFrame:
    rows = [
        {"t_s": sample.t_s, **{name: getattr(sample.snapshot, field) for name, field in SERIES.items()}}
        for sample in figures.samples
        if sample.snapshot is not None
    ]
    return pd.DataFrame(rows, columns=["t_s", *SERIES_NAMES], dtype=float)


def runs_from_offline_root(root: Path) -> list[SourcedRun]:
    """Runs tracked offline (`runs/<uuid>/run.plx.json` and `events/metric/*.plx`), read with Polyaxon's loaders."""
    input_directory(root, "--offline-root")
    runs_dir = root / "runs"
    if not runs_dir.is_dir():
        raise HarnessError(f"{root}: not a Polyaxon offline root (no runs/ directory)")
    from polyaxon.client import RunClient

    runs = []
    for run_file in sorted(runs_dir.glob(f"*/{OFFLINE_RUN_FILE}")):
        try:
            client = RunClient.load_offline_run(path=str(run_file.parent), run_client=_offline_client(),
                                                raise_if_not_found=True)
        except (ValueError, TypeError) as error:  # pydantic and orjson errors are ValueErrors
            raise HarnessError(f"{run_file}: not a readable Polyaxon run: {str(error).splitlines()[0]}") from None
        data = client.run_data
        series = _offline_series(run_file.parent / "events" / "metric")
        runs.append(SourcedRun(run_uuid=plain_uuid(data.uuid, run_file), inputs=dict(data.inputs or {}),
                               outputs=dict(data.outputs or {}), series=series, origin=str(run_file.parent)))
    return runs


def _offline_client() -> Any:
    quiet_polyaxon()
    from polyaxon.client import RunClient

    logging.getLogger("polyaxon").setLevel(logging.WARNING)  # "offline data loaded from ..." per run
    return RunClient(is_offline=True, owner="offline", project="offline")


def _offline_series(metric_dir: Path) -> pd.DataFrame:
    from traceml.events import V1Events

    frames = []
    for name in SERIES_NAMES:
        path = metric_dir / f"{live_name(name)}.plx"
        if path.exists():
            events = V1Events.read(kind="metric", name=live_name(name), data=str(path), parse_dates=False).df
            frames.append(events[["step", "timestamp", "metric"]].rename(columns={"metric": name}))
    return _series_from_events(frames)


def runs_from_polyaxon(project: str, query: str | None = None, limit: int = DEFAULT_API_LIMIT) -> list[SourcedRun]:
    """Runs of a project on the Polyaxon API, each with its inputs, outputs and metric series."""
    quiet_polyaxon()
    from polyaxon.client import RunClient

    named = parse_project(project)
    failure = f"cannot read runs of Polyaxon project '{named}'"
    # The client's constructor (it reads the configuration) and its answers' shapes fail as calls do.
    listed = polyaxon_call(failure, lambda: RunClient(owner=named.owner, project=named.name)
                           .list(query=query, limit=limit).results) or []
    return [polyaxon_call(failure, partial(_sourced_run, RunClient, named, run)) for run in listed]


def _sourced_run(client_class: Any, named: ProjectName, run: Any) -> SourcedRun:
    """One listed run with its metric series, read from the API."""
    client = client_class(owner=named.owner, project=named.name, run_uuid=run.uuid)
    metrics = client.get_metrics(names=[live_name(series) for series in SERIES_NAMES])
    frames = [pd.DataFrame(metrics[live_name(series)]["data"]).rename(columns={"metric": series})
              [["step", "timestamp", series]] for series in SERIES_NAMES if live_name(series) in metrics]
    return SourcedRun(run_uuid=plain_uuid(run.uuid, f"{named}/{run.uuid}"), inputs=dict(run.inputs or {}),
                      outputs=dict(run.outputs or {}), series=_series_from_events(frames),
                      origin=f"{named}/{run.uuid}")


def _series_from_events(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Metric events joined on their step; time is seconds since the first event."""
    merged: pd.DataFrame | None = None
    for frame in frames:
        merged = frame if merged is None else merged.merge(frame.drop(columns="timestamp"), on="step", how="outer")
    if merged is None or merged.empty:
        return pd.DataFrame(columns=["t_s", *SERIES_NAMES], dtype=float)
    merged = merged.sort_values("step")
    stamps = pd.to_datetime(merged["timestamp"], utc=True, errors="coerce", format="ISO8601")
    merged["t_s"] = (stamps - stamps.min()).dt.total_seconds() if stamps.notna().all() else merged["step"].astype(float)
    return merged.reindex(columns=["t_s", *SERIES_NAMES]).astype(float).reset_index(drop=True)


def collect_runs(
    run_dirs: Sequence[Path] = (),
    offline_root: Path | None = None,
    project: str | None = None,
    query: str | None = None,
    limit: int = DEFAULT_API_LIMIT,
) -> list[SourcedRun]:
    """Runs from every source given; finding none is bad input that names where it looked."""
    runs = runs_from_directories(run_dirs)
    if offline_root is not None:
        runs += runs_from_offline_root(offline_root)
    if project is not None:
        runs += runs_from_polyaxon(project, query, limit)
    if not runs:
        places = [f"--runs {path}" for path in run_dirs] + ([f"--offline-root {offline_root}"] if offline_root else [])
        places += [f"--project {project}" + (f" --query '{query}'" if query else "")] if project else []
        searched = ", ".join(places) or "nothing (give --runs, --offline-root or --project)"
        raise HarnessError(f"no run records found in {searched}")
    return runs
