"""`harness check`, `serve`, `run-local` and `sweep`: polyaxonfiles compiled, served and swept."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from harness.cli.app import app, one_line_errors
from harness.cli.polyaxon_options import (
    harness_deadline_option,
    harness_files_option,
    local_option,
    project_option,
    queue_option,
    running_deadline_option,
)
from harness.errors import EXIT_CODES_HELP, EXIT_INVALID, HarnessError
from harness.measure.timeouts import READY_TIMEOUT_S
from harness.redact import redact_text
from harness.schema import RunFile


def warn_overridden(names: list[str], params: dict[str, Any]) -> None:
    """A -P value that every sweep point replaces is legal but does nothing: say so."""
    for name in names:
        print(f"warning: -P {name}={params[name]} is not used: every point of the sweep sets {name}", file=sys.stderr)


@app.command()
@one_line_errors
def check(
    files: list[Path] = typer.Option(..., "-f", "--file", help="polyaxonfile, then presets (as for polyaxon run)"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
) -> None:
    """Compile a polyaxonfile (+ presets) with Polyaxon's compiler; a sweep is compiled point by point."""
    from harness.launch.specs import check_files, overridden_params, parse_param_options

    params = parse_param_options(param)
    points = check_files(files, params)
    warn_overridden(overridden_params(files, params), params)
    described = " + ".join(str(path) for path in files)
    if points:
        print(f"{described}: valid, {len(points)} sweep points each compiled")
        for index, point in enumerate(points):
            print(f"  point {index}: {point}")
    else:
        print(f"{described}: valid")


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def serve(
    files: list[Path] = typer.Option(..., "-f", "--file", help="service polyaxonfile, then presets"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
    log: Path = typer.Option(Path(RunFile.ENGINE_LOG), help="file that receives the engine's stdout and stderr"),
    port: int | None = typer.Option(None, help="local port (default: a free one)"),
    health_timeout_s: float = typer.Option(READY_TIMEOUT_S, help="seconds to wait for /health"),
) -> None:
    """Run a service polyaxonfile on the local vLLM engine until interrupted (Ctrl-C stops it cleanly, exit 130)."""
    from harness.launch.engine_process import local_engine, wait_while_healthy
    from harness.launch.specs import parse_param_options
    from harness.measure.timeouts import positive_seconds
    from harness.paths import output_file

    params = parse_param_options(param)
    if port is not None and not 1 <= port <= 65535:
        raise HarnessError(f"--port: {port} is not a port (1-65535); leave it out for a free one")
    positive_seconds(health_timeout_s, "--health-timeout-s")
    output_file(log, "--log")
    with local_engine(files, params, log_path=log, port=port, health_timeout_s=health_timeout_s) as engine:
        try:
            print(f"engine healthy at {engine.base_url} (pid {engine.pid}, log {engine.log_path})", flush=True)
            wait_while_healthy(engine)
        except KeyboardInterrupt:  # the engine stops on the way out; the exit code says it was stopped
            print("stopping the engine", flush=True)
            raise


@app.command("run-local", epilog=EXIT_CODES_HELP)
@one_line_errors
def run_local(
    files: list[Path] = typer.Option(..., "-f", "--file", help="job polyaxonfile or sweep, then presets"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
    out: Path = typer.Option(Path("runs/local"), help="directory for each point's outputs"),
    offline_root: Path = typer.Option(Path("runs/polyaxon"), help="Polyaxon offline root the runs are tracked in"),
    project: str = typer.Option("local/vllm-harness", help="project the offline runs belong to"),
) -> None:
    """Execute a compiled experiment (or every point of its sweep) as local processes, tracked offline."""
    from harness.launch.engine_process import stop_on_sigterm
    from harness.launch.local_executor import run_locally
    from harness.launch.specs import overridden_params, parse_param_options
    from harness.paths import output_directory
    from harness.polyaxon_project import parse_project
    from harness.track.tracking import offline_tracking_env

    def announce(index: int, total: int, point: dict[str, object]) -> None:
        print(f"point {index + 1}/{total}: {point}", file=sys.stderr, flush=True)

    params = parse_param_options(param)
    output_directory(out, "--out")
    output_directory(offline_root, "--offline-root")
    parse_project(project)
    warn_overridden(overridden_params(files, params), params)
    with stop_on_sigterm():
        runs = run_locally(files, params, out_root=out,
                           env=offline_tracking_env(offline_root, project), on_start=announce)
    for run in runs:
        print(f"point {run.index}: exit {run.exit_code}, outputs {run.outputs_dir}")
    print(f"offline runs in {offline_root} (polyaxon ops ls --offline --path {offline_root} -io)")
    if any(run.exit_code != 0 for run in runs):
        raise typer.Exit(EXIT_INVALID)


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def sweep(
    files: list[Path] = typer.Option(..., "-f", "--file", help="sweep polyaxonfile (its matrix gives the points)"),
    service_files: list[Path] = typer.Option([Path("polyaxonfiles/vllm-service.yaml")], "--service",
                                             help="service polyaxonfile, then its presets"),
    harness_files: list[Path] = harness_files_option(),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value for the service or the harness job"),
    project: str | None = project_option(),
    local: bool = local_option(),
    queue: str | None = queue_option(),
    running_deadline_s: float = running_deadline_option(),
    harness_deadline_s: float = harness_deadline_option(),
    out: Path = typer.Option(Path("runs/sweep"), help="directory for the sweep result and failed points' logs"),
) -> None:
    """Vary one limit over a vLLM service: start it, run the harness job against it, stop it; next point."""
    from harness.launch.engine_process import stop_on_sigterm
    from harness.launch.specs import parse_param_options
    from harness.launch.sweep import (
        Backend,
        LocalBackend,
        Outcome,
        PolyaxonBackend,
        check_harness_params,
        check_sweep_out,
        run_sweep,
        service_params,
        sweep_points,
    )
    from harness.measure.timeouts import positive_seconds
    from harness.polyaxon_project import check_queue, parse_project
    from harness.track.tracking import DEFAULT_PROJECT, offline_tracking_env

    params = parse_param_options(param)
    check_sweep_out(out)
    if project is not None:
        parse_project(project)
    if queue is not None:
        check_queue(queue)
    positive_seconds(running_deadline_s, "--running-deadline-s")
    positive_seconds(harness_deadline_s, "--harness-deadline-s")
    limit, points = sweep_points(files, service_files, params)
    for_service = service_params(service_files, params)
    for_harness = {name: value for name, value in params.items() if name not in for_service}
    check_harness_params(harness_files, for_harness)
    warn_overridden([limit] if limit in params else [], params)
    backend: Backend
    if local:
        tracking = offline_tracking_env(out / "polyaxon", project or DEFAULT_PROJECT)
        backend = LocalBackend(service_files, harness_files, for_harness, out=out, env=tracking)
    elif project is None:
        raise HarnessError("give --project OWNER/NAME (or NAME), or --local to run on this machine")
    else:
        backend = PolyaxonBackend(project, service_files, harness_files, for_harness, queue=queue,
                                  running_deadline_s=running_deadline_s, harness_deadline_s=harness_deadline_s,
                                  logs_dir=out / "logs",
                                  announce=lambda message: print(message, file=sys.stderr, flush=True))
    with stop_on_sigterm():
        result = run_sweep(files[0], limit, [{**for_service, **point} for point in points], backend,
                           on_point=lambda point: print(f"point {point.index}: {point.outcome}", flush=True))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(redact_text(result.model_dump_json(indent=2)), encoding="utf-8")
    print(f"sweep over {limit}: {out / 'sweep.json'}")
    if any(point.outcome != Outcome.MEASURED for point in result.points):
        raise typer.Exit(EXIT_INVALID)
