"""`harness run`: send a frozen inventory at a set load and record every request."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from harness.cli.app import app, one_line_errors
from harness.cli.fields import field_flags, field_option, flags_for_fields, refused_as_flags
from harness.errors import EXIT_CODES_HELP, EXIT_ENGINE_DID_NOT_START, EXIT_INVALID, HarnessError, exit_code_for_signal
from harness.measure.run_options import RunOptions, Slo
from harness.measure.schedule import LoadShape


@app.command("run", epilog=EXIT_CODES_HELP)
@one_line_errors
@flags_for_fields
def run_command(
    inventory: Path = field_option(RunOptions, "inventory"),
    out: Path = typer.Option(..., help="run record directory to write (refused if it holds a run)"),
    force: bool = typer.Option(False, help="move a run already in --out aside to OUT.replaced-<run id>"),
    base_url: str | None = field_option(RunOptions, "base_url"),
    service_uuid: str | None = field_option(RunOptions, "service_uuid"),
    service_port: int = field_option(RunOptions, "service_port"),
    concurrency: int | None = field_option(LoadShape, "concurrency"),
    rate: float | None = field_option(LoadShape, "rate_per_s"),
    burstiness: float = field_option(LoadShape, "burstiness"),
    max_concurrency: int | None = field_option(LoadShape, "max_concurrency"),
    max_tokens: int | None = field_option(RunOptions, "max_tokens"),
    requests: int | None = field_option(LoadShape, "requests"),
    duration_s: float | None = field_option(LoadShape, "duration_s"),
    warmup: int = field_option(LoadShape, "warmup_requests"),
    seed: int = field_option(LoadShape, "seed"),
    order: str = field_option(LoadShape, "order"),
    think_time_s: float = field_option(LoadShape, "think_time_s"),
    temperature: float = field_option(RunOptions, "temperature"),
    slo_ttft_ms: float | None = field_option(Slo, "ttft_ms"),
    slo_tpot_ms: float | None = field_option(Slo, "tpot_ms"),
    slo_target_share: float | None = field_option(Slo, "target_share"),
    cold: bool = field_option(RunOptions, "cold"),
    sample_interval_s: float = field_option(RunOptions, "sample_interval_s"),
    max_dispatch_lag_ms: float = field_option(RunOptions, "max_dispatch_lag_ms"),
    max_error_fraction: float = field_option(RunOptions, "max_error_fraction"),
    read_timeout_s: float | None = field_option(RunOptions, "read_timeout_s"),
    stall_timeout_s: float | None = field_option(RunOptions, "stall_timeout_s"),
    ready_timeout_s: float = field_option(RunOptions, "ready_timeout_s"),
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
    from harness.measure.run_options import build_run_config
    from harness.paths import output_directory
    from harness.polyaxon_project import parse_project
    from harness.redact import refuse_url_credentials

    if engine and (base_url or service_uuid):
        raise HarnessError("an engine command after -- sets the server; drop --base-url/--service-uuid")
    if base_url is not None:  # before anything could echo the URL: its user info is remembered and masked
        refuse_url_credentials(base_url, "--base-url")
    with refused_as_flags(field_flags(run_command)):
        options = RunOptions(
            inventory=inventory, base_url=engine_base_url(engine) if engine else base_url,
            service_uuid=service_uuid, service_port=service_port,
            load=LoadShape(concurrency=concurrency, rate_per_s=rate, burstiness=burstiness,
                           max_concurrency=max_concurrency, requests=requests, duration_s=duration_s,
                           warmup_requests=warmup, seed=seed, order=order, think_time_s=think_time_s),
            max_tokens=max_tokens, temperature=temperature,
            slo=Slo(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms, target_share=slo_target_share),
            cold=cold, sample_interval_s=sample_interval_s, max_dispatch_lag_ms=max_dispatch_lag_ms,
            max_error_fraction=max_error_fraction, read_timeout_s=read_timeout_s, stall_timeout_s=stall_timeout_s,
            ready_timeout_s=ready_timeout_s,
        )
    run_dir_plan(out, force=force)  # everything is checked before the record's folder is made
    if project is not None:
        parse_project(project)
    if offline_root is not None:
        output_directory(offline_root, "--offline-root")
    config, prompts = build_run_config(options)
    with claimed_run_dir(out, force=force) as moved:
        summary, tracked = measure(config, prompts, out, engine_argv=engine, ready_timeout_s=options.ready_timeout_s,
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
