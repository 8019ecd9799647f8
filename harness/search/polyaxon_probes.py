"""Probes as ordinary runs on a Polyaxon API: CE has no tuner that picks the next load from the last result.

CE's scheduler leaves the `iterative` matrix unimplemented, and `bayes`/`hyperband` need a tuner component
CE does not resolve; so the search is driven from outside. Each probe is submitted as one run of the
experiment (or of the harness job against a running service, as `harness sweep` does) with the probe's
load as -P values and its tags, in the order the search measures; the runner waits until the run has
ended and downloads the record the job left under its outputs (`--out {{ globals.run_outputs_path }}/run`)
into a local run directory, which the search reads as it reads a local probe. Every probe is a new run:
the components disable Polyaxon's cache, so a resubmitted probe is measured again.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.launch.engine_process import exit_if_terminated
from harness.launch.specs import load_operation
from harness.measure.record import RunConfig, check_run_files
from harness.polyaxon_client import polyaxon_call
from harness.polyaxon_project import parse_project
from harness.schema import RunFile, TrackedRun
from harness.search.probe import Knob, Probe

ENDED = {"succeeded", "failed", "stopped", "upstream_failed", "skipped", "done"}
RECORD_PATH = "outputs/run"  # where the components' `harness run --out` leaves the record in a run's artifacts


def probe_params(probe: Probe) -> dict[str, Any]:
    """The -P values a probe adds to the search's own: its load, and how much it sends when it says."""
    params: dict[str, Any] = {probe.knob.value: int(probe.value) if probe.knob == Knob.CONCURRENCY else probe.value}
    sized = {"requests": probe.requests, "warmup": probe.warmup_requests or None,
             "max_concurrency": probe.max_concurrency if probe.knob == Knob.RATE else None}
    return params | {name: value for name, value in sized.items() if value is not None}


def probe_name(probe: Probe) -> str:
    """A run name Polyaxon accepts, telling the probes of one search apart in the dashboard."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", f"search-{probe.search_id}-step-{probe.step}-repeat-{probe.repeat}")


class PolyaxonProbeRunner:
    """Each probe one run of `files` in `project`; the record read back into `out/<probe name>`."""

    def __init__(self, project: str, files: Sequence[Path], params: dict[str, Any], *, out: Path,
                 deadline_s: float, queue: str | None = None, poll_s: float = 2.0,
                 announce: Callable[[str], None] = lambda message: None) -> None:
        from polyaxon.client import RunClient

        self.project = parse_project(project)
        self.files, self.out, self.queue = list(files), out, queue
        # the load is the probe's: a -P value for either knob would be overridden or clash with it
        self.params = {name: value for name, value in params.items() if name not in set(Knob)}
        self.deadline_s, self.poll_s, self.announce = deadline_s, poll_s, announce
        self.client = polyaxon_call(f"cannot reach Polyaxon project {self.project}",
                                    lambda: RunClient(owner=self.project.owner, project=self.project.name))

    def run(self, probe: Probe) -> Path:
        return self.collect(probe, self.submit(probe))

    def submit(self, probe: Probe) -> str:
        """Create the probe's run, compiled with Polyaxon's compiler first; its UUID."""
        operation = load_operation(self.files, {**self.params, **probe_params(probe)})
        if self.queue:
            operation.queue = self.queue
        name = probe_name(probe)
        created = polyaxon_call(f"cannot create run '{name}' in {self.project}",
                                lambda: self.client.create(name=name, tags=probe.tags(), content=operation))
        self.announce(f"probe {probe.step}.{probe.repeat} ({probe.knob.at(probe.value)}): run {created.uuid}")
        return str(created.uuid)

    def collect(self, probe: Probe, run_uuid: str) -> Path:
        """Wait until the run has ended, then download its record; a run that left none is one line."""
        run = self._client(run_uuid)
        status = self._wait(run)
        if status not in ENDED:
            polyaxon_call(f"could not stop run {run_uuid}; stop it by hand", run.stop)
            raise HarnessError(f"probe run {run_uuid} was still '{status}' after {self.deadline_s:g} s; stopped it")
        record = self._download(run, self.out / probe_name(probe))
        if record is None:
            raise HarnessError(f"probe run {run_uuid} ended '{status}' and left no run record under {RECORD_PATH}")
        check_probe_record(record, probe, TrackedRun(run_uuid=run_uuid, owner=self.project.owner,
                                                     project=self.project.name, offline_root=None))
        return record

    def _client(self, run_uuid: str) -> Any:
        from polyaxon.client import RunClient

        return RunClient(owner=self.project.owner, project=self.project.name, run_uuid=run_uuid)

    def _wait(self, run: Any) -> str:
        deadline = time.monotonic() + self.deadline_s
        while True:
            polyaxon_call(f"cannot read the status of run {run.run_uuid}", run.refresh_data)
            exit_if_terminated()
            status = str(run.run_data.status)
            if status in ENDED or time.monotonic() > deadline:
                return status
            time.sleep(self.poll_s)

    def _download(self, run: Any, record: Path) -> Path | None:
        """The run's `outputs/run` as `record`; None when the run's artifacts hold no record."""
        tree = polyaxon_call(f"cannot list the artifacts of run {run.run_uuid}",
                             lambda: run.get_artifacts_tree(path=RECORD_PATH))
        if not (tree.files or tree.dirs):
            return None
        staging = record.with_name(record.name + ".download")
        shutil.rmtree(staging, ignore_errors=True)
        polyaxon_call(f"cannot download the record of run {run.run_uuid}",
                      lambda: run.download_artifacts(path=RECORD_PATH, path_to=str(staging)))
        if record.exists():
            raise HarnessError(f"{record}: already holds a probe's record; give the search a new directory")
        (staging / RECORD_PATH).rename(record)
        shutil.rmtree(staging)
        return record


def check_probe_record(record: Path, probe: Probe, tracked: TrackedRun) -> None:
    """The record is the probe's: a run record, measured at the probe's load, joined on the run's UUID."""
    run_uuid = tracked.run_uuid
    check_run_files(record)
    config = RunConfig.model_validate_json((record / RunFile.CONFIG).read_text(encoding="utf-8"))
    measured = config.load.concurrency if probe.knob == Knob.CONCURRENCY else config.load.rate_per_s
    if measured is None or float(measured) != probe.value:
        raise HarnessError(f"{record}: run {run_uuid} measured {probe.knob.value} {measured}, not the probe's "
                           f"{probe.value:g}")
    tracking = record / RunFile.TRACKING
    if not tracking.exists():  # the job ran untracked: the run's UUID is still what the analysis joins on
        tracking.write_text(tracked.model_dump_json(indent=2), encoding="utf-8")
