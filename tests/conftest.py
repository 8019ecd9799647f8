"""Shared fixtures: the generated tiny model, and the real engine started from the project's polyaxonfiles."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from harness.dev.tiny_model import ensure_tiny_model
from harness.errors import EXIT_INVALID
from harness.loopback import free_port
from harness.measure.ready import wait_until_healthy
from harness.polyaxon_client import BUSY_STATUS, QUIET_POLYAXON_ENV, quiet_polyaxon

if TYPE_CHECKING:  # importing the launcher loads polyaxon: seconds that tests without an engine need not pay
    from harness.launch.engine_process import RunningEngine
    from harness.search.objective import PercentileObjective

TEST_NICENESS = -10  # CFS weight 9,548 against 1,024 at niceness 0: about 90% of a shared core

quiet_polyaxon()  # for the tests that import polyaxon themselves
# Engines started from the polyaxonfiles refuse to serve without a key (harness/launch/engine_auth.py); every
# engine a test starts, and every client, shares this one.
os.environ.setdefault("VLLM_API_KEY", secrets.token_hex(16))
# The engines and clients the tests start inherit this priority. On a shared machine a second workload at
# normal priority otherwise takes the client's core and its runs end invalid ("loop_stall_share"), rightly:
# the tests check the harness, not the machine's other tenants. Where raising it is not allowed, it stays.
with contextlib.suppress(PermissionError):
    os.setpriority(os.PRIO_PROCESS, 0, TEST_NICENESS)

REPO_ROOT = Path(__file__).resolve().parent.parent
HARNESS = str(Path(sys.executable).with_name("harness"))
SERVICE_FILE = REPO_ROOT / "polyaxonfiles" / "vllm-service.yaml"
LOCAL_CPU_PRESET = REPO_ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"
# The verdicts a run gets when the machine, not the server or the harness, kept the client from measuring: on a
# busy laptop or shared node the harness rightly calls such a run invalid. Tests whose point is not the client's
# health accept these and nothing else; the tests of the verdicts themselves (tests/measure/test_stats.py,
# test_client_emulated.py's busy-loop test) do not.
BUSY_MACHINE_REASONS = ("client fell behind its schedule", "client sent late", "client event loop stalled",
                        "sampler missed its ticks")


def bash_commands(markdown: Path) -> list[list[str]]:
    """The commands in a Markdown file's bash blocks as words: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown.read_text(encoding="utf-8"), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def invalid_but_for_a_busy_machine(reasons: list[str]) -> list[str]:
    """The reasons a run is invalid that no busy machine explains: what a test must find empty."""
    return [reason for reason in reasons if not reason.startswith(BUSY_MACHINE_REASONS)]


def invalid_only_because_busy(run_dir: Path) -> bool:
    """The run's summary calls it invalid, and only for reasons a busy machine explains."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return False
    reasons = json.loads(summary.read_text())["invalid_reasons"]
    return bool(reasons) and not invalid_but_for_a_busy_machine(reasons)


def ran_but_for_a_busy_machine(returncode: int | None, run_dir: Path) -> bool:
    """`harness run` finished with a valid run, or with one its summary calls invalid only because this machine
    was busy (exit 3)."""
    return returncode == 0 or (returncode == EXIT_INVALID and invalid_only_because_busy(run_dir))


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a Polyaxon API (the polyaxon_api fixture, directly or through another fixture) is
    marked `sandbox`, so that `-m "not sandbox"` leaves out every one of them: refuse the run otherwise."""
    unmarked = [item.nodeid for item in items
                if "polyaxon_api" in getattr(item, "fixturenames", ()) and item.get_closest_marker("sandbox") is None]
    if unmarked:
        raise pytest.UsageError("these tests use polyaxon_api without @pytest.mark.sandbox: " + ", ".join(unmarked))


def local_cpu_engine(
    model_dir: Path, log_path: Path, health_timeout_s: float = 300, **params: object
) -> AbstractContextManager[RunningEngine]:
    """The real engine from the service polyaxonfile + local-cpu preset; `params` win over the preset.

    For a module-scoped engine: `with local_cpu_engine(tiny_model_dir, path, max_num_seqs=4) as engine:`.
    """
    from harness.launch.engine_process import local_engine

    return local_engine(
        [SERVICE_FILE, LOCAL_CPU_PRESET],
        {"model": str(model_dir), **params},
        log_path=log_path,
        health_timeout_s=health_timeout_s,
    )


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The seed-0 tiny Qwen3 model, generated once into the harness cache and reused."""
    return ensure_tiny_model(seed=0)


@pytest.fixture(scope="session")
def ttft_limit(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PercentileObjective:
    """The engine tests' p99 TTFT objective in this machine's unit (objective.py `ttft_objective`): six times
    the median of three lone prefills of the inventory's 600-token prompt, each timed as one request that asks
    for a single token, on the preset's engine."""
    from harness.search.objective import ttft_objective
    from harness.server_auth import auth_headers

    prompt = json.loads((REPO_ROOT / "prompts" / "tiny-qwen3-600x8" / "prompts.jsonl").read_text().splitlines()[0])
    log = tmp_path_factory.mktemp("ttft-unit") / "engine.log"
    with local_cpu_engine(tiny_model_dir, log, max_num_seqs=1, enable_prefix_caching=False) as engine:
        model = httpx.get(f"{engine.base_url}/v1/models", headers=auth_headers(), timeout=60).json()["data"][0]["id"]
        body = {"model": model, "prompt": prompt["token_ids"], "max_tokens": 1}
        elapsed_ms = []
        for _ in range(4):  # the first warms the engine's paths and is not counted
            started = time.perf_counter()
            httpx.post(f"{engine.base_url}/v1/completions", json=body, headers=auth_headers(), timeout=120)
            elapsed_ms.append(1000 * (time.perf_counter() - started))
    return ttft_objective(sorted(elapsed_ms[1:])[1])


@pytest.fixture
def start_engine(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., RunningEngine]]:
    """`start_engine(max_num_seqs=4, ...)` starts the real engine; every engine it started stops at teardown."""
    with ExitStack() as running:

        def start(log_name: str = "engine.log", **params: Any) -> RunningEngine:
            return running.enter_context(local_cpu_engine(tiny_model_dir, tmp_path / log_name, **params))

        yield start


@pytest.fixture(scope="session")
def polyaxon_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Polyaxon API (`haupt sandbox`, SQLite): it stores, compiles and expands runs, never executes them."""
    home = tmp_path_factory.mktemp("polyaxon-sandbox")
    port = free_port()
    env = {**os.environ, "HOME": str(home), **QUIET_POLYAXON_ENV}
    haupt = str(Path(sys.executable).with_name("haupt"))
    log = open(home / "sandbox.log", "wb")  # noqa: SIM115 - closed at teardown
    process = subprocess.Popen(
        [haupt, "sandbox", "start", "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--path", str(home)],
        cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    host = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{host}/api/v1/installation", timeout=2).json().get("mode") == "sandbox":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haupt sandbox did not start: {(home / 'sandbox.log').read_text()[-2000:]}")
            time.sleep(0.25)
        from polyaxon import settings

        previous = settings.CLIENT_CONFIG.host
        settings.CLIENT_CONFIG.host = os.environ["POLYAXON_HOST"] = host  # this process and its children
        yield host
        settings.CLIENT_CONFIG.host = previous
        os.environ.pop("POLYAXON_HOST")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def create_project(name: str, deadline_s: float = 60) -> str:
    """A project on the sandbox, as `default/<name>`. The sandbox answers HTTP 405 to any write while it is
    still expanding runs a test just submitted (a sweep's six services), for longer under a full test run than
    the harness's own calls wait: ask again for up to a minute."""
    from polyaxon.client import ProjectClient
    from polyaxon.exceptions import ApiException

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            ProjectClient(owner="default").create({"name": name})
            return f"default/{name}"
        except ApiException as refused:
            if refused.status != BUSY_STATUS or time.monotonic() > deadline:
                raise
            time.sleep(2)


def polyaxon_cli(*args: str, timeout_s: float = 300, deadline_s: float = 60) -> subprocess.CompletedProcess[str]:
    """The polyaxon CLI against the sandbox, asked again while it answers HTTP 405 because it is still expanding
    runs an earlier test submitted (create_project's wait): that answer writes nothing, so asking again is safe."""
    polyaxon = str(Path(sys.executable).with_name("polyaxon"))
    deadline = time.monotonic() + deadline_s
    while True:
        done = subprocess.run([polyaxon, *args], capture_output=True, text=True, timeout=timeout_s)
        if done.returncode == 0 or "Status: 405" not in done.stdout + done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(2)


@contextmanager
def emulator(**options: object) -> Iterator[str]:
    """`harness emulate` in a subprocess; yields its base URL once /health answers."""
    with emulator_process(**options) as (base_url, _):
        yield base_url


@contextmanager
def emulator_process(**options: object) -> Iterator[tuple[str, subprocess.Popen]]:
    """The emulator and its process, for tests that kill or freeze the server mid-run."""
    port = free_port()
    args = [HARNESS, "emulate", "--port", str(port)]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}"
    try:
        if wait_until_healthy(base_url, 20, process=process, poll_s=0.05, request_timeout_s=1) != "healthy":
            process.kill()  # one that is still starting would keep its stderr open for ever
            _, stderr = process.communicate(timeout=10)
            raise RuntimeError(f"emulator did not start: {stderr.decode()}")
        yield base_url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a frozen emulator cannot act on SIGTERM
            process.terminate()
        process.wait(timeout=10)

