"""Programs the tests start in a child interpreter, as a module lint and type checks read.

`python tests/child_programs.py NAME [ARGS...]`; `argv(NAME, ...)` builds that command line. Each program but
the engine caller uses the standard library only, so any interpreter runs it (the engine's, a bare venv's).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path


def argv(name: str, *args: str, python: str | Path = sys.executable) -> list[str]:
    """The command line that runs program `name` under `python`."""
    return [str(python), __file__, name, *args]


def busy_loop(seconds: str) -> None:
    """Spend a core for `seconds`, then end by itself."""
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        pass


def print_purelib() -> None:
    """Where this interpreter installs pure-Python packages."""
    print(sysconfig.get_paths()["purelib"])


def ignore_sigterm() -> None:
    """Ignore SIGTERM, say so with an empty line, then wait to be killed."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(flush=True)
    time.sleep(600)


def stubborn_tree() -> None:
    """A group leader that obeys SIGTERM over a child that ignores it; prints the child's pid once it is set."""
    child = subprocess.Popen(argv("ignore-sigterm"), stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(600)


def engine_caller(model: str, log: str) -> None:
    """Start the real engine as the tests do, print its pid as JSON, then wait to be killed."""
    from conftest import local_cpu_engine  # the tests' folder is this script's, first on its path

    with local_cpu_engine(Path(model), Path(log)) as engine:
        print(json.dumps({"pid": engine.pid}), flush=True)
        time.sleep(3600)


PROGRAMS: dict[str, Callable[..., None]] = {
    "busy-loop": busy_loop,
    "print-purelib": print_purelib,
    "ignore-sigterm": ignore_sigterm,
    "stubborn-tree": stubborn_tree,
    "engine-caller": engine_caller,
}

if __name__ == "__main__":
    PROGRAMS[sys.argv[1]](*sys.argv[2:])
