"""`harness run`: send a frozen inventory at a set load and record every request."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from harness.cli.app import app, one_line_errors
from harness.errors import EXIT_CODES_HELP, EXIT_ENGINE_DID_NOT_START, EXIT_INVALID, HarnessError, exit_code_for_signal
from harness.measure.timeouts import READY_TIMEOUT_S


@app.command("run", epilog=EXIT_CODES_HELP)
@one_line_errors
def run_command(
    inventory: Path = typer.Option(..., help="prompt inventory directory"),
    out: Path = typer.Option(..., help="run record directory to write (refused if it holds a run)"),
    force: bool = typer.Option(False, help="move a run already in --out aside to OUT.replaced-<run id>"),
    base_url: str | None = typer.Option(None, help="server base URL, e.g. http://127.0.0.1:8000"),
    service_uuid: str | None = typer.Option(None, help="Polyaxon service run measured (reached in-cluster "
                                            "unless --base-url says where)"),
    service_port: int = typer.Option(8000, help="port of the Polyaxon service"),
    concurrency: int | None = typer.Option(None, help="closed loop: requests kept in flight"),
    rate: float | None = typer.Option(None, help="open loop: mean arrivals per second"),
    burstiness: float = typer.Option(1.0, help="gamma shape of inter-arrival times (1 = Poisson)"),
    max_concurrency: int | None = typer.Option(None, help="cap on in-flight requests under --rate"),
    max_tokens: int | None = typer.Option(None, help="output cap for every request (default: the inventory's)"),
    requests: int | None = typer.Option(None, help="measured requests (default: one pass over the inventory)"),
    duration_s: float | None = typer.Option(None, help="stop scheduling after this many seconds"),
    warmup: int = typer.Option(0, help="requests sent first and left out of the results"),
    seed: int = typer.Option(0, help="seed for arrivals and shuffling"),
    order: str = typer.Option("inventory", help="prompt order per pass: inventory or shuffled"),
    think_time_s: float = typer.Option(0.0, help="conversations: seconds after a turn ends before the next is sent"),
    temperature: float = typer.Option(0.0, help="sampling temperature sent with every request"),
    slo_ttft_ms: float | None = typer.Option(None, help="goodput SLO on time to first token, ms"),
    slo_tpot_ms: float | None = typer.Option(None, help="goodput SLO on time per output token, ms"),
    cold: bool = typer.Option(False, help="declare the run cold: prefix-cache hits make it invalid"),
    sample_interval_s: float = typer.Option(5.0, help="seconds between /metrics scrapes (each holds vLLM's "
                                            "API server a few ms)"),
    max_dispatch_lag_ms: float = typer.Option(10.0, help="p99 dispatch lag above which the run is invalid"),
    max_error_fraction: float = typer.Option(0.05, help="share of failed requests above which the run is invalid"),
    read_timeout_s: float | None = typer.Option(None, help="longest wait for a request's first byte, s (default: "
                                                "60 + every request in flight producing its cap at 40 tokens/s)"),
    stall_timeout_s: float | None = typer.Option(None, help="no byte for this long once a response started ends "
                                                 "the request as 'stalled' (at most 5% later), s (default: 30 + "
                                                 "0.1 per request in flight)"),
    ready_timeout_s: float = typer.Option(READY_TIMEOUT_S, help="seconds to wait for the server's /health (progress on "
                                          "stderr; a server that answers but is not vLLM fails at once)"),
    project: str | None = typer.Option(None, envvar="HARNESS_PROJECT", help="track in this Polyaxon project: "
                                       "OWNER/NAME, or NAME for default/NAME"),
    offline_root: Path | None = typer.Option(None, envvar="HARNESS_OFFLINE_ROOT",
                                             help="track offline into this Polyaxon offline root"),
    engine: list[str] | None = typer.Argument(None, help="after --: an engine command line to start, "
                                              "measure and stop (a self-contained experiment)"),
) -> None:
    """Send an inventory at a set load; record every request, the server's metrics and a summary.

    With an engine command after `--`, start that engine first, keep its start-up log and capacity,
    and stop it afterwards: one run = one configuration.
    """
    from harness.launch.engine_process import engine_base_url
    from harness.launch.experiment import measure
    from harness.measure.record import claimed_run_dir, run_dir_plan
    from harness.measure.run_options import build_run_config, command_line_options
    from harness.measure.timeouts import positive_seconds
    from harness.paths import output_directory
    from harness.polyaxon_project import parse_project

    if engine and (base_url or service_uuid):
        raise HarnessError("an engine command after -- sets the server; drop --base-url/--service-uuid")
    options = command_line_options(
        inventory=inventory, base_url=engine_base_url(engine) if engine else base_url,
        service_uuid=service_uuid, service_port=service_port,
        load=dict(concurrency=concurrency, rate_per_s=rate, burstiness=burstiness, max_concurrency=max_concurrency,
                  requests=requests, duration_s=duration_s, warmup_requests=warmup, seed=seed, order=order,
                  think_time_s=think_time_s),
        max_tokens=max_tokens, temperature=temperature, slo=dict(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms),
        cold=cold, sample_interval_s=sample_interval_s, max_dispatch_lag_ms=max_dispatch_lag_ms,
        max_error_fraction=max_error_fraction, read_timeout_s=read_timeout_s, stall_timeout_s=stall_timeout_s,
    )
    positive_seconds(ready_timeout_s, "--ready-timeout-s")
    run_dir_plan(out, force=force)  # everything is checked before the record's folder is made
    if project is not None:
        parse_project(project)
    if offline_root is not None:
        output_directory(offline_root, "--offline-root")
    config, prompts = build_run_config(options)
    with claimed_run_dir(out, force=force) as moved:
        summary, tracked = measure(config, prompts, out, engine_argv=engine, ready_timeout_s=ready_timeout_s,
                                   project=project, offline_root=offline_root)
    if moved is not None:
        print(f"moved the run that was in {out} to {moved}", file=sys.stderr)
    if tracked is not None:
        print(f"tracked as Polyaxon run {tracked.run_uuid} in {tracked.owner}/{tracked.project}", file=sys.stderr)
    if summary is None:  # not bad input: the record is the result, and says how far the engine got
        print(f"error: the engine did not start; its log and capacity are in {out}", file=sys.stderr)
        raise typer.Exit(EXIT_ENGINE_DID_NOT_START)
    print(summary.model_dump_json(indent=2))
    stopped = exit_code_for_signal(summary.stopped_by_signal)
    if stopped is not None:
        raise typer.Exit(stopped)
    if not summary.valid:
        print(f"invalid run: {'; '.join(summary.invalid_reasons)}", file=sys.stderr)
        raise typer.Exit(EXIT_INVALID)
