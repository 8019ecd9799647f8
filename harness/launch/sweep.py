"""`harness sweep`: one limit at a time over a vLLM service, then the harness against each point.

On Polyaxon CE a DAG step that depends on a service waits for it to finish, which a service never does,
and start-on-running events are commercial. So a driver does the sequencing: for each point it starts
the service, waits until it is running (with its own deadline), runs the harness against it, and stops
the service before the next point. A point that fails or is late is recorded with its logs and the sweep
goes on. The same loop runs locally on the CPU engine, with the same polyaxonfiles.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from harness.errors import EXIT_INVALID, HarnessError
from harness.launch.engine_process import EngineStartError, RunningEngine, exit_if_terminated, local_engine
from harness.launch.experiment import SERVICE_LOG_ENV
from harness.launch.local_executor import run_locally
from harness.launch.specs import check_sweep, declared_inputs, load_operation, render
from harness.paths import output_directory
from harness.polyaxon_client import polyaxon_call
from harness.polyaxon_project import parse_project
from harness.redact import redact_text
from harness.schema import RunFile

SWEEP_SCHEMA_VERSION = 1
RUNNING = "running"
PLACEHOLDER_SERVICE_UUID = "0" * 32  # stands for the service each point starts, when checking the harness job
ENDED = {"succeeded", "failed", "stopped", "upstream_failed", "skipped", "done"}


class Outcome(StrEnum):
    MEASURED = "measured"
    MEASURED_INVALID = "measured_invalid"  # the harness finished, but its summary says the run is invalid
    SERVICE_FAILED = "service_failed"
    SERVICE_LATE = "service_late"
    HARNESS_FAILED = "harness_failed"


class PointResult(BaseModel):
    index: int
    params: dict[str, Any]
    outcome: Outcome
    service: str | None = None  # the service run's UUID, or the local engine's log
    harness: str | None = None  # the harness run's UUID, or the local run record
    detail: str | None = None


class SweepResult(BaseModel):
    schema_version: int = SWEEP_SCHEMA_VERSION
    sweep_file: str
    limit: str
    points: list[PointResult]


class PointFailed(Exception):
    def __init__(self, outcome: Outcome, service: str | None, detail: str) -> None:
        super().__init__(detail)
        self.outcome, self.service, self.detail = outcome, service, detail


class Backend(Protocol):
    def service(self, index: int, params: dict[str, Any]) -> AbstractContextManager[str]:
        """Yields the running service's id; raises PointFailed when it does not run; always stops it."""

    def harness(self, index: int, service: str) -> tuple[str, Outcome, str | None]:
        """Run the harness against the service: (run id or record, outcome, detail)."""


def sweep_points(
    sweep_files: Sequence[Path], service_files: Sequence[Path], params: dict[str, Any]
) -> tuple[str, list[dict[str, Any]]]:
    """The sweep file's matrix points, each checked with Polyaxon's compiler against the sweep file and
    against the service, each with the -P values it declares (the sweep file's own loop needs them)."""
    declared = declared_inputs(sweep_files)
    for_sweep = {name: value for name, value in params.items() if name in declared}
    points = render(sweep_files, for_sweep).matrix_points
    if not points:
        raise HarnessError(f"{sweep_files[0]}: no matrix; a sweep needs one limit and its values")
    check_sweep(sweep_files, points, for_sweep)  # one limit at a time, the refusal naming the sweep file
    check_sweep(service_files, points, service_params(service_files, params))
    return next(iter(points[0])), points


def check_sweep_out(out: Path) -> None:
    """--out can be written and holds no earlier sweep (its result, or the points an interrupted one left):
    two sweeps' points never mix."""
    output_directory(out, "--out")
    if (out / "sweep.json").exists():
        raise HarnessError(f"--out {out}: already holds a sweep ({out / 'sweep.json'}); give a new directory")
    used = sorted(path.name for path in out.glob("point-*")) + (["logs"] if (out / "logs").exists() else [])
    if used:
        raise HarnessError(f"--out {out}: an earlier sweep's points are in {', '.join(used[:5])}; give a new directory")


def check_harness_params(harness_files: Sequence[Path], params: dict[str, Any]) -> None:
    """The harness job compiled with its -P values before any service starts: a bad value or an input it
    does not declare fails here, not after a GPU service was created for nothing."""
    render(harness_files, {**params, "service_uuid": PLACEHOLDER_SERVICE_UUID})


def service_params(service_files: Sequence[Path], params: dict[str, Any]) -> dict[str, Any]:
    """The params the service declares; the rest are the harness's."""
    inputs = set(render(service_files).inputs)
    return {name: value for name, value in params.items() if name in inputs}


def run_sweep(
    sweep_file: Path, limit: str, points: list[dict[str, Any]], backend: Backend, *,
    on_point: Callable[[PointResult], None] | None = None,
) -> SweepResult:
    """Every point in order; a failed or late point is recorded and the sweep goes on."""
    results: list[PointResult] = []
    for index, point in enumerate(points):
        try:
            with backend.service(index, point) as service:
                harness, outcome, detail = backend.harness(index, service)
                result = PointResult(index=index, params=point, outcome=outcome, service=service,
                                     harness=harness, detail=detail)
        except PointFailed as failed:
            result = PointResult(index=index, params=point, outcome=failed.outcome, service=failed.service,
                                 detail=failed.detail)
        results.append(result)
        if on_point is not None:
            on_point(result)
    return SweepResult(sweep_file=str(sweep_file), limit=limit, points=results)


class PolyaxonBackend:
    """Service and harness job as Polyaxon runs in one project (queue and file presets when given)."""

    def __init__(self, project: str, service_files: Sequence[Path], harness_files: Sequence[Path],
                 harness_params: dict[str, Any], *, queue: str | None, running_deadline_s: float,
                 harness_deadline_s: float, logs_dir: Path, poll_s: float = 2.0,
                 announce: Callable[[str], None] = lambda message: None) -> None:
        from polyaxon.client import RunClient

        self.project = parse_project(project)
        self.client = RunClient(owner=self.project.owner, project=self.project.name)
        self.service_files, self.harness_files = list(service_files), list(harness_files)
        self.harness_params = harness_params
        self.queue, self.poll_s, self.logs_dir = queue, poll_s, logs_dir
        self.running_deadline_s, self.harness_deadline_s = running_deadline_s, harness_deadline_s
        self.announce = announce

    def _create(self, files: list[Path], params: dict[str, Any], name: str) -> Any:
        operation = load_operation(files, params)
        if self.queue:
            operation.queue = self.queue
        created = polyaxon_call(f"cannot create run '{name}' in {self.project}",
                                lambda: self.client.create(name=name, content=operation))
        from polyaxon.client import RunClient

        return RunClient(owner=self.project.owner, project=self.project.name, run_uuid=created.uuid)

    def _wait(self, run: Any, until: set[str], deadline_s: float) -> str:
        deadline = time.monotonic() + deadline_s
        while True:
            polyaxon_call(f"cannot read the status of run {run.run_uuid}", run.refresh_data)
            exit_if_terminated()
            status = str(run.run_data.status)
            if status in until or status in ENDED or time.monotonic() > deadline:
                return status
            time.sleep(self.poll_s)

    @contextmanager
    def service(self, index: int, params: dict[str, Any]) -> Iterator[str]:
        point = "-".join(f"{name}-{value}" for name, value in params.items())
        run = self._create(self.service_files, params, re.sub(r"[^A-Za-z0-9_-]", "-", f"vllm-{point}"))
        uuid = run.run_uuid
        try:
            self.announce(f"service {uuid} created; waiting until it is running")
            status = self._wait(run, {RUNNING}, self.running_deadline_s)
            if status != RUNNING:
                logs = self._save_logs(run, index)
                outcome = Outcome.SERVICE_LATE if status not in ENDED else Outcome.SERVICE_FAILED
                raise PointFailed(outcome, uuid, f"service {uuid} was '{status}' after "
                                  f"{self.running_deadline_s:g} s, not running (logs: {logs})")
            yield uuid
        finally:
            self._stop(run)

    def _stop(self, run: Any) -> None:
        polyaxon_call(f"could not stop service {run.run_uuid}; stop it by hand", run.stop)

    def harness(self, index: int, service: str) -> tuple[str, Outcome, str | None]:
        run = self._create(self.harness_files, {**self.harness_params, "service_uuid": service},
                           f"harness-{service}")
        status = self._wait(run, ENDED, self.harness_deadline_s)
        if status == "succeeded":
            return run.run_uuid, Outcome.MEASURED, None
        if status == "failed" and (run.run_data.outputs or {}).get("valid") is False:  # exit 3 after tracking
            return run.run_uuid, Outcome.MEASURED_INVALID, str(run.run_data.outputs.get("invalid_reasons"))
        return run.run_uuid, Outcome.HARNESS_FAILED, f"harness run ended '{status}'"

    def _save_logs(self, run: Any, index: int) -> Path:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        path = self.logs_dir / f"point-{index}-{run.run_uuid}.log"
        try:
            logs = polyaxon_call("no logs", run.get_logs)
            lines = [str(getattr(line, "value", line)) for line in (logs.logs or [])]
        except HarnessError as error:  # the service may have no logs yet; say so in the file
            lines = [str(error)]
        path.write_text(redact_text("\n".join(lines) + "\n"), encoding="utf-8")
        return path


class LocalBackend:
    """The service on the local CPU engine; the harness job compiled and run as a local process against it."""

    def __init__(self, service_files: Sequence[Path], harness_files: Sequence[Path], harness_params: dict[str, Any],
                 *, out: Path, env: dict[str, str]) -> None:
        self.service_files, self.harness_files = list(service_files), list(harness_files)
        self.harness_params, self.out, self.env = harness_params, out, env
        self.engines: dict[str, RunningEngine] = {}

    @contextmanager
    def service(self, index: int, params: dict[str, Any]) -> Iterator[str]:
        service_uuid = uuid.uuid4().hex
        log = self.out / f"point-{index}" / "service" / RunFile.ENGINE_LOG
        with ExitStack() as stack:
            try:
                engine = stack.enter_context(local_engine(self.service_files, params, log_path=log))
            except EngineStartError as error:
                raise PointFailed(Outcome.SERVICE_FAILED, str(log), str(error)) from None
            self.engines[service_uuid] = engine
            yield service_uuid

    def harness(self, index: int, service: str) -> tuple[str, Outcome, str | None]:
        engine = self.engines.pop(service)
        [run] = run_locally(self.harness_files, {**self.harness_params, "service_uuid": service},
                            out_root=self.out / f"point-{index}" / "harness",
                            env={**self.env, SERVICE_LOG_ENV: str(engine.log_path)},
                            extra_args=["--base-url", engine.base_url])
        record = Path(run.outputs_dir) / "run"
        if run.exit_code == EXIT_INVALID:
            return str(record), Outcome.MEASURED_INVALID, f"harness exited with {run.exit_code}: run invalid"
        if run.exit_code != 0:
            return str(record), Outcome.HARNESS_FAILED, f"harness exited with {run.exit_code}"
        return str(record), Outcome.MEASURED, None
