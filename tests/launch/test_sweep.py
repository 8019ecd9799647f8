"""The service + harness sweep driver against a real Polyaxon API (haupt sandbox, which never runs anything)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from polyaxon.client import RunClient

from harness.errors import HarnessError
from harness.launch.engine_process import stop_on_sigterm
from harness.launch.specs import render
from harness.launch.sweep import Outcome, PolyaxonBackend, run_sweep, sweep_points
from harness.loopback import free_port

from conftest import create_project, polyaxon_cli

ROOT = Path(__file__).resolve().parents[2]
HARNESS = str(Path(sys.executable).with_name("harness"))
SERVICE = [ROOT / "polyaxonfiles" / "vllm-service.yaml"]
HARNESS_JOB = [ROOT / "polyaxonfiles" / "harness-job.yaml"]


def sweep_file(tmp_path: Path, values: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "kind: operation\n"
        f"matrix:\n  kind: mapping\n  concurrency: 1\n  values: {values}\n"
        f"pathRef: {SERVICE[0]}\n"
    )
    return path


def backend(project: str, tmp_path: Path, deadline_s: float = 2.0) -> PolyaxonBackend:
    return PolyaxonBackend(project, SERVICE, HARNESS_JOB, {}, queue=None, running_deadline_s=deadline_s,
                           harness_deadline_s=10, logs_dir=tmp_path / "logs", poll_s=0.3)


def test_points_come_from_the_sweep_file_and_are_checked(tmp_path: Path) -> None:
    limit, points = sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: 8}]")], SERVICE, {})
    assert (limit, points) == ("max_num_seqs", [{"max_num_seqs": 4}, {"max_num_seqs": 8}])
    with pytest.raises(HarnessError, match=r"point 1 changes 'max_model_len' besides 'max_num_seqs'"):
        sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_model_len: 2048}]")], SERVICE, {})
    with pytest.raises(HarnessError, match=r"point 1 \{'max_num_seqs': 0\}.*max_num_seqs"):
        sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: 0}]")], SERVICE, {})
    with pytest.raises(HarnessError, match="max_num_seqs"):
        sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: eight}]")], SERVICE, {})


@pytest.mark.sandbox
def test_a_service_not_running_by_the_deadline_is_recorded_stopped_and_the_sweep_goes_on(
    tmp_path: Path, polyaxon_api: str
) -> None:
    create_project("sweep-late")
    limit, points = sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: 8}]")], SERVICE, {})
    result = run_sweep(tmp_path / "sweep.yaml", limit, points, backend("default/sweep-late", tmp_path))
    assert [point.outcome for point in result.points] == [Outcome.SERVICE_LATE, Outcome.SERVICE_LATE]
    for point, value in zip(result.points, (4, 8), strict=True):
        service = RunClient(owner="default", project="sweep-late", run_uuid=point.service)
        deadline = time.monotonic() + 30  # the API applies a stop asynchronously
        while True:
            service.refresh_data()
            if str(service.run_data.status) in {"stopping", "stopped"} or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert service.run_data.inputs["max_num_seqs"] == value
        assert str(service.run_data.status) in {"stopping", "stopped"}
        assert point.detail is not None and "not running" in point.detail
        assert (tmp_path / "logs" / f"point-{point.index}-{point.service}.log").exists()
    assert point.harness is None  # no harness job against a service that never ran


@pytest.mark.sandbox
def test_unknown_project_and_unreachable_api_stop_the_sweep_with_one_line(tmp_path: Path, polyaxon_api: str,
                                                                          monkeypatch) -> None:
    limit, points = sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}]")], SERVICE, {})
    with pytest.raises(HarnessError, match="default/no-such-project"):
        run_sweep(tmp_path / "sweep.yaml", limit, points, backend("default/no-such-project", tmp_path))
    from polyaxon import settings

    monkeypatch.setattr(settings.CLIENT_CONFIG, "host", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HarnessError, match="cannot create run"):
        run_sweep(tmp_path / "sweep.yaml", limit, points, backend("default/sweep-late", tmp_path))


@pytest.mark.sandbox
def test_the_experiment_sweep_runs_natively_as_one_child_per_point(polyaxon_api: str) -> None:
    """`polyaxon run -f polyaxonfiles/sweep-max-num-seqs.yaml`: the CE-compatible sweep, expanded by the API."""
    create_project("native-matrix")
    created = polyaxon_cli("run", "-f", str(ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml"), "-p",
                           "native-matrix", "-P", "concurrency=32", timeout_s=120)
    assert created.returncode == 0, created.stdout + created.stderr
    sweep = render([ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml"], {"concurrency": 32})
    expected = [point["max_num_seqs"] for point in sweep.matrix_points]
    client = RunClient(owner="default", project="native-matrix")
    deadline = time.monotonic() + 60
    while True:
        children = [run for run in client.list(limit=100).results if run.kind == "job"]
        if len(children) >= len(expected) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sorted(child.inputs["max_num_seqs"] for child in children) == sorted(expected)
    assert {child.inputs["concurrency"] for child in children} == {32}
    held = [{k: v for k, v in child.inputs.items() if k != "max_num_seqs"} for child in children]
    assert all(inputs == held[0] for inputs in held)  # one limit at a time


class SwallowingRun:
    """A run whose refresh takes the SIGTERM and loses its SystemExit, as Polyaxon's client did in a CI run
    ("Exception ignored in: 'get_run_with_http_info'"): the status never changes."""

    def __init__(self) -> None:
        self.refreshes = 0
        self.run_uuid = "0" * 32
        self.run_data = SimpleNamespace(status="created")

    def refresh_data(self) -> None:
        self.refreshes += 1
        if self.refreshes == 1:
            with contextlib.suppress(SystemExit):
                os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_lost_inside_polyaxons_client_still_ends_the_wait(tmp_path: Path) -> None:
    """Without the check after each refresh the wait would run to its 60 s deadline."""
    run = SwallowingRun()
    started = time.monotonic()
    with stop_on_sigterm(), pytest.raises(SystemExit) as stopped:
        backend("default/lost-signal", tmp_path, deadline_s=60)._wait(run, {"running"}, 60)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert run.refreshes == 1 and time.monotonic() - started < 5


@pytest.mark.sandbox
def test_interrupting_the_sweep_stops_the_service_it_started(tmp_path: Path, polyaxon_api: str) -> None:
    create_project("sweep-interrupted")
    sweep = sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: 8}]")
    driver = subprocess.Popen(
        [HARNESS, "sweep", "-f", str(sweep), "--service", str(SERVICE[0]), "--harness", str(HARNESS_JOB[0]),
         "--project", "default/sweep-interrupted", "--running-deadline-s", "600", "--out", str(tmp_path / "out"),
         "-P", "concurrency=4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = RunClient(owner="default", project="sweep-interrupted")
    # SIGTERM once the driver holds the service (it announces that on stderr, maybe after warnings)
    assert driver.stderr is not None
    assert any("waiting until it is running" in line for line in driver.stderr)
    driver.send_signal(signal.SIGTERM)
    # The stop is one API call that Polyaxon's client lets run 60 s (its request timeout), asked again for
    # 10 s while the API answers 405: a busy sandbox can take most of that. Both pipes are read to the end
    # meanwhile, so a driver blocked on a full pipe cannot look hung.
    try:
        _, rest = driver.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, rest = driver.communicate(timeout=10)
        raise AssertionError(f"the driver did not end within 150 s of SIGTERM; its stderr after it:\n{rest}") from None
    [service] = client.list(limit=10).results  # the second point never started
    stopped = RunClient(owner="default", project="sweep-interrupted", run_uuid=service.uuid)
    deadline = time.monotonic() + 30
    while True:
        stopped.refresh_data()
        if str(stopped.run_data.status) in {"stopping", "stopped"} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert str(stopped.run_data.status) in {"stopping", "stopped"}
    assert driver.returncode == 143, rest  # 128 + SIGTERM


def test_the_experiment_sweep_is_checked_with_the_p_values_it_declares() -> None:
    """The README's `harness sweep -f polyaxonfiles/sweep-max-num-seqs.yaml ... -P concurrency=32`: the sweep
    file's own loop needs concurrency, the service never declares it."""
    sweep = [ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml"]
    service = [*SERVICE, ROOT / "polyaxonfiles" / "presets" / "gpu-a100-80gb.yaml"]
    limit, points = sweep_points(sweep, service, {"concurrency": "32"})
    assert limit == "max_num_seqs" and [point["max_num_seqs"] for point in points] == [1, 2, 4, 8, 16, 32]


@pytest.mark.sandbox
@pytest.mark.parametrize(("param", "message"), [
    ("concurrency=-1", "greater than or equal to `1`"),
    ("bogus_param=1", "undeclared param `bogus_param`"),
])
def test_bad_harness_params_stop_the_sweep_before_any_service_is_created(
    tmp_path: Path, polyaxon_api: str, param: str, message: str
) -> None:
    create_project(f"sweep-bad-{param.split('=')[0].replace('_', '-')}")
    project = f"default/sweep-bad-{param.split('=')[0].replace('_', '-')}"
    extra = [] if param.startswith("concurrency") else ["-P", "concurrency=4"]
    done = subprocess.run(
        [HARNESS, "sweep", "-f", str(sweep_file(tmp_path, "[{max_num_seqs: 4}]")), "--service", str(SERVICE[0]),
         "--harness", str(HARNESS_JOB[0]), "--project", project, "-P", param, *extra, "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert RunClient(owner="default", project=project.split("/")[1]).list(limit=10).results == []
