"""Run a compiled job polyaxonfile (one run or a matrix of points) as local processes: the embedded default.

`polyaxon run --local` needs a docker daemon, and its process executor crashes in 2.18, so the project
executes compiled specs itself: Polyaxon's compiler renders each point's container command exactly as a
cluster would get it, and only what belongs to the image changes here — `harness` is this environment's
console script, the engine's interpreter is the engine's virtual environment, and the engine listens on a
free loopback port. Every point is checked before the first one starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from harness.errors import HarnessError
from harness.launch.engine_auth import refuse_unauthenticated
from harness.launch.engine_process import ENGINE_MODULE, engine_python, engine_reference, local_engine_words
from harness.launch.specs import RenderedRun, check_files, render
from harness.loopback import free_port

# A stopped point records its requests in flight, tracks its run and stops its engine within this.
POINT_STOP_GRACE_S = 120.0


class LocalRun(BaseModel):
    index: int
    params: dict[str, Any]
    outputs_dir: str
    exit_code: int


def run_locally(
    polyaxonfiles: Sequence[Path],
    params: dict[str, Any],
    *,
    out_root: Path,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    on_start: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> list[LocalRun]:
    """Each point's container command as a local process, one after another; returns their exit codes."""
    files = [Path(path) for path in polyaxonfiles]
    points = check_files(files, params) or [dict(params)]  # a file without a matrix is one point
    refuse_unauthenticated(render(files, params).inputs, files, os.environ | (env or {}))
    refuse_used_outputs(out_root, len(points))
    rendered_points = [render_point(files, point, index, out_root) for index, point in enumerate(points)]
    runs = []
    for index, (point, rendered) in enumerate(zip(points, rendered_points, strict=True)):
        outputs = point_outputs(out_root, index)
        outputs.mkdir(parents=True, exist_ok=True)
        if on_start is not None:
            on_start(index, len(points), point)
        argv = local_job_argv(rendered.argv, extra_args)
        with (outputs / "stdout.log").open("wb") as stdout:  # progress stays on stderr, results go to the file
            # not the images the spec names: no container runs here
            local = {"HARNESS_IMAGE_REFERENCE": engine_reference(), "HARNESS_CONTAINER_IMAGE": ""}
            process = subprocess.Popen(argv, env=os.environ | rendered.env | local | (env or {}), stdout=stdout)
            exit_code = wait_passing_stop(process)
        runs.append(LocalRun(index=index, params=point, outputs_dir=str(outputs), exit_code=exit_code))
    return runs


def point_outputs(out_root: Path, index: int) -> Path:
    return (out_root / f"point-{index}").resolve()


def render_point(files: list[Path], point: dict[str, Any], index: int, out_root: Path) -> RenderedRun:
    """A point as its container would run, checked to be a job the harness runs: every point is checked
    before any point's folder is made, so a refused file leaves nothing behind."""
    outputs = point_outputs(out_root, index)
    rendered = render(files, point, run_globals={
        "uuid": f"local-{index}", "name": f"point-{index}",
        "run_outputs_path": str(outputs), "run_artifacts_path": str(outputs),
    })
    if rendered.kind != "job":
        raise HarnessError(f"{files[0]}: run.kind is '{rendered.kind}'; the local executor runs jobs")
    if rendered.argv[:1] != ["harness"]:
        raise HarnessError(f"{files[0]}: expected the container command to start with 'harness': "
                           f"{' '.join(rendered.argv)}")
    return rendered


def refuse_used_outputs(out_root: Path, points: int) -> None:
    """Every point writes into out_root/point-N; an earlier sweep's outputs there would mix two runs."""
    used = [f"point-{index}" for index in range(points)
            if (out_root / f"point-{index}").is_dir() and any((out_root / f"point-{index}").iterdir())]
    if used:
        raise HarnessError(f"--out {out_root}: an earlier run's outputs are in {', '.join(used)}; "
                           "give a new directory")


def wait_passing_stop(process: subprocess.Popen[bytes]) -> int:
    """Wait for a point's process. When this process is stopped, the point is stopped the same way and
    waited for, so it records its requests in flight and stops its engine before the sweep exits: Ctrl-C
    reaches the whole process group already; SIGTERM (SystemExit under `stop_on_sigterm`) is passed on."""
    try:
        return process.wait()
    except (KeyboardInterrupt, SystemExit) as stop:
        if isinstance(stop, SystemExit):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=POINT_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
        raise


def local_job_argv(words: list[str], extra_args: Sequence[str] = ()) -> list[str]:
    """The container's words with `harness` from this environment and the engine from its own venv.

    `extra_args` go to harness, before any engine command (e.g. where a local service answers).
    """
    harness = [str(Path(sys.executable).with_name("harness"))]
    if ENGINE_MODULE not in words:
        return [*harness, *words[1:], *extra_args]
    split = words.index("--")
    engine = local_engine_words(words[split + 1 :], engine_python(), free_port())
    return [*harness, *words[1:split], *extra_args, "--", *engine]
