"""`harness search`: the most load of a workload that meets an objective, and why the knee sits there."""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel, ConfigDict

from harness.cli.app import app, one_line_errors
from harness.cli.fields import field_option
from harness.cli.polyaxon_options import (
    harness_deadline_option,
    harness_files_option,
    local_option,
    project_option,
    queue_option,
    running_deadline_option,
)
from harness.errors import EXIT_CODES_HELP, EXIT_INVALID, HarnessError
from harness.measure.run_options import RunOptions
from harness.measure.schedule import MAX_IN_FLIGHT
from harness.schema import SERVICE_LOG_ENV

MAX_KNOB_VALUES = 100_000  # a grid this fine is already past what a bisection's few probes can tell apart
PERCENTILE_FIGURE = re.compile(r"^(ttft|tpot|e2e)_ms_p(\d+(?:\.\d+)?)=(.+)$")


def percentile_objectives(ttft_p99: float | None, tpot_p99: float | None, e2e_p99: float | None,
                          others: list[str]) -> list:
    """The percentile objectives from the p99 options and `--slo FIGURE=LIMIT` ('ttft_ms_p90=500')."""
    from pydantic import ValidationError

    from harness.search.objective import PercentileObjective

    given = [(latency, 99.0, limit) for latency, limit in (("ttft", ttft_p99), ("tpot", tpot_p99), ("e2e", e2e_p99))
             if limit is not None]
    for text in others:
        matched = PERCENTILE_FIGURE.match(text.strip())
        if matched is None:
            raise HarnessError(f"--slo: {text!r} is not FIGURE=LIMIT_MS with FIGURE ttft_ms_pNN, tpot_ms_pNN or "
                               "e2e_ms_pNN (e.g. ttft_ms_p90=500)")
        try:
            given.append((matched[1], float(matched[2]), float(matched[3])))
        except ValueError:
            raise HarnessError(f"--slo: {matched[3]!r} in {text!r} is not a number of ms") from None
    objectives = []
    for latency, percentile, limit in given:
        try:
            objectives.append(PercentileObjective(latency=latency, percentile=percentile, limit_ms=limit))
        except ValidationError as error:
            flag = f"--slo-{latency}-ms-p99" if percentile == 99.0 else f"--slo {latency}_ms_p{percentile:g}"
            raise HarnessError(f"{flag}: {error.errors()[0]['msg']} ({error.errors()[0]['input']})") from None
    return objectives


def knob_values(low: float, high: float, step: float, over: str) -> list[float]:
    """Every load the search may probe, from --low to --high by --step (it bisects them, probing few)."""
    if not 0 < low <= high or step <= 0:
        raise HarnessError(f"--low {low:g}, --high {high:g}, --step {step:g}: need 0 < low ≤ high and a positive step")
    count = int((high - low) / step + 1e-9) + 1
    if count > MAX_KNOB_VALUES:
        raise HarnessError(f"--low {low:g}, --high {high:g}, --step {step:g}: {count:,} loads to search, more than "
                           f"{MAX_KNOB_VALUES:,}; take a larger --step or a lower --high")
    if over == "concurrency" and high > MAX_IN_FLIGHT:
        raise HarnessError(f"--high {high:g}: more requests in flight than the client keeps "
                           f"(at most {MAX_IN_FLIGHT:,})")
    values = [low + index * step for index in range(count)]
    if over == "concurrency" and any(not float(value).is_integer() for value in values):
        raise HarnessError("--low/--step: concurrency is a whole number of requests")
    return values


def check_load_cap(over: str, max_concurrency: int | None) -> None:
    """An open loop's cap is what bounds its requests in flight, which the prediction and the probes need."""
    if over == "rate" and max_concurrency is None:
        raise HarnessError("--over rate needs --max-concurrency N: the cap on requests in flight, which sizes each "
                           "probe and bounds the population the prediction is made for")
    if over == "concurrency" and max_concurrency is not None:
        raise HarnessError(f"--max-concurrency {max_concurrency}: only under --over rate; a closed loop's "
                           "requests in flight are the concurrency searched")


def objectives_of(ttft_p99: float | None, tpot_p99: float | None, e2e_p99: float | None, others: list[str],
                  attain_ttft_ms: float | None, attain_tpot_ms: float | None, attain_share: float) -> list:
    """Every objective given: percentiles, then attainment; at least one."""
    from harness.search.objective import AttainmentObjective

    objectives = percentile_objectives(ttft_p99, tpot_p99, e2e_p99, others)
    if attain_ttft_ms is not None or attain_tpot_ms is not None:
        objectives.append(AttainmentObjective(ttft_ms=attain_ttft_ms, tpot_ms=attain_tpot_ms,
                                              target_share=attain_share))
    if not objectives:
        raise HarnessError("give an objective: --slo-ttft-ms-p99 MS (or --slo-tpot-ms-p99, --slo-e2e-ms-p99, "
                           "--slo ttft_ms_p90=MS, --attain-ttft-ms MS)")
    return objectives


def where_probes_run(files: list[Path], base_url: str | None, project: str | None, local: bool) -> str:
    """'server' (--base-url: a server already running), 'local' (--local: engines started here) or 'api'
    (--project: services and harness jobs on a Polyaxon API); a mix of them is refused."""
    from harness.polyaxon_project import parse_project

    if project is not None:
        parse_project(project)
    if base_url is not None:
        if files:
            raise HarnessError("-f and --base-url: give the experiment to start (-f) or the server running at "
                               "--base-url, not both")
        if project is not None:
            raise HarnessError("--project and --base-url: the probes against --base-url run here, tracked offline "
                               "in OUT/polyaxon; --project sends them to a Polyaxon API as harness jobs")
        return "server"
    if not files:
        raise HarnessError("give the experiment with -f (the service polyaxonfile or a sweep file, then presets), "
                           "or --base-url URL of a server already running")
    if local:
        return "local"
    if project is None:
        raise HarnessError("give --project OWNER/NAME (or NAME), or --local to run on this machine")
    return "api"


def check_sources(mode: str, files: list[Path], service_file: Path, harness_files: list[Path],
                  base_url: str | None, service_log: Path | None, max_num_seqs: int | None) -> None:
    """The files an engine (and on the API, its probes) start from, or the server's URL and what the user
    says of it."""
    from harness.paths import input_file, read_text
    from harness.server_url import checked_server_url

    if mode == "server":
        checked_server_url(base_url or "", "--base-url")
    else:
        for path in files:
            input_file(path, "--file")
        input_file(service_file, "--service")
    for path in harness_files if mode == "api" else []:
        input_file(path, "--harness")
    log_option = f"--service-log (${SERVICE_LOG_ENV})"
    if service_log is not None and not read_text(service_log, log_option).strip():
        raise HarnessError(f"{log_option} {service_log}: empty; expected the server's start-up log")
    if mode != "server" and (service_log is not None or max_num_seqs is not None):
        raise HarnessError("--service-log and --max-num-seqs say what a server at --base-url does not: with -f "
                           "the engine's own log and command line say it")


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def search(
    files: list[Path] = typer.Option([], "-f", "--file", help="service polyaxonfile or sweep file, then presets"),
    service_file: Path = typer.Option(Path("polyaxonfiles/vllm-service.yaml"), "--service",
                                      help="the service a sweep file's points start"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
    base_url: str | None = field_option(RunOptions, "base_url"),
    service_log: Path | None = typer.Option(None, envvar=SERVICE_LOG_ENV, help="with --base-url: the server's "
                                            "start-up log, its KV memory and limits (as `harness run` reads it)"),
    max_num_seqs: int | None = typer.Option(None, min=1, help="with --base-url: the server's max_num_seqs, "
                                            "where its start-up log does not state it"),
    inventory: Path = typer.Option(..., help="prompt inventory directory"),
    over: str = typer.Option("concurrency", help="the load searched: concurrency (closed loop) or rate (open loop)"),
    low: float = typer.Option(1, help="the lowest load of the range"),
    high: float = typer.Option(..., help="the highest load of the range"),
    step: float = typer.Option(1, help="the grid's step over the range"),
    max_concurrency: int | None = typer.Option(None, help="under --over rate: the cap on requests in flight"),
    slo_ttft_ms_p99: float | None = typer.Option(None, help="objective: p99 TTFT at most this many ms"),
    slo_tpot_ms_p99: float | None = typer.Option(None, help="objective: p99 TPOT at most this many ms"),
    slo_e2e_ms_p99: float | None = typer.Option(None, help="objective: p99 end-to-end latency at most this many ms"),
    slo: list[str] = typer.Option([], help="another percentile objective, e.g. ttft_ms_p90=500 (repeatable)"),
    attain_ttft_ms: float | None = typer.Option(None, help="attainment objective: a request's TTFT limit"),
    attain_tpot_ms: float | None = typer.Option(None, help="attainment objective: a request's TPOT limit"),
    attain_share: float = typer.Option(0.95, help="attainment objective: the share of requests within the limits"),
    max_tokens: int | None = typer.Option(None, help="output cap for every request (default: the inventory's)"),
    cold: bool = typer.Option(False, help="every probe must miss the prefix cache (else it is invalid)"),
    max_repeats: int = typer.Option(3, help="valid runs of an undecided load before it is reported undecided"),
    turnovers: int = typer.Option(3, help="measured requests per probe: this many times the requests in flight"),
    min_requests: int = typer.Option(8, help="measured requests per probe, at least"),
    seed: int = typer.Option(0, help="seed for arrivals and the bootstrap"),
    out: Path = typer.Option(Path("runs/search"), help="directory for the probes' runs and the search's report"),
    project: str | None = project_option(),
    local: bool = local_option(),
    harness_files: list[Path] = harness_files_option(),
    queue: str | None = queue_option(),
    running_deadline_s: float = running_deadline_option(),
    harness_deadline_s: float = harness_deadline_option(),
) -> None:
    """Find the most load that meets the objective, one engine per configuration, bracketed by the prediction.

    Engines start here (--local) or as Polyaxon services probed by harness jobs (--project), or: --base-url.
    """
    from harness.errors import validate_options
    from harness.launch.engine_process import stop_on_sigterm
    from harness.measure.schedule import LoadShape
    from harness.paths import input_directory, output_directory
    from harness.redact import refuse_url_credentials
    from harness.search.driver import SearchPlan
    from harness.search.probe import Knob

    if over not in ("concurrency", "rate"):
        raise HarnessError(f"--over: {over!r} is neither concurrency nor rate")
    check_load_cap(over, max_concurrency)
    objectives = objectives_of(slo_ttft_ms_p99, slo_tpot_ms_p99, slo_e2e_ms_p99, slo, attain_ttft_ms,
                               attain_tpot_ms, attain_share)
    if base_url is not None:
        refuse_url_credentials(base_url, "--base-url")
    mode = where_probes_run(files, base_url, project, local)
    check_sources(mode, files, service_file, harness_files, base_url, service_log, max_num_seqs)
    input_directory(inventory, "--inventory")
    output_directory(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise HarnessError(f"--out {out}: already holds files; give a new directory")
    plan = SearchPlan(search_id=uuid.uuid4().hex[:12], knob=Knob(over), values=knob_values(low, high, step, over),
                      objectives=objectives, max_repeats=max_repeats, turnovers=turnovers, min_requests=min_requests,
                      max_concurrency=max_concurrency, cold=cold, seed=seed)
    # The load and the server are each probe's: a placeholder of each checks the rest of the options now.
    options = validate_options(RunOptions, dict(inventory=inventory, load=LoadShape(concurrency=1, seed=seed),
                                                base_url=base_url or "http://127.0.0.1:1", max_tokens=max_tokens,
                                                cold=cold))
    announce = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731 - one line, said once
    searched_where = SearchedWhere(mode=mode, project=project, out=out)
    with stop_on_sigterm():
        if mode == "server":
            result = on_server(base_url or "", service_log, max_num_seqs, plan, options, searched_where, announce)
        elif mode == "local":
            result = on_this_machine(files, service_file, param, plan, options, searched_where, announce)
        else:
            result = on_api(files, service_file, param, plan, options, searched_where, announce,
                            ApiChoices(harness_files=harness_files, queue=queue, running_deadline_s=running_deadline_s,
                                       harness_deadline_s=harness_deadline_s))
    tell(result, searched_where)


class SearchedWhere(BaseModel):
    """Where the probes ran and where the search's own run is tracked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: str  # server, local or api (where_probes_run)
    project: str | None
    out: Path

    @property
    def offline_root(self) -> Path | None:
        return None if self.mode == "api" else self.out / "polyaxon"

    @property
    def tracked_in(self) -> str:
        from harness.track.tracking import DEFAULT_PROJECT

        return self.project or DEFAULT_PROJECT


class ApiChoices(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    harness_files: list[Path]
    queue: str | None
    running_deadline_s: float
    harness_deadline_s: float


def local_search(options: RunOptions, where: SearchedWhere) -> Any:
    from harness.search.local import LocalSearch

    return LocalSearch(options=options, out=where.out, project=where.tracked_in,
                       offline_root=where.offline_root or where.out / "polyaxon")


def on_server(base_url: str, service_log: Path | None, max_num_seqs: int | None, plan: Any, options: RunOptions,
              where: SearchedWhere, announce: Callable[[str], None]) -> Any:
    """The load searched on the server at --base-url; its start-up log read once, as `harness run` reads it."""
    from harness.paths import read_text
    from harness.search.server import search_server

    log_text = read_text(service_log, f"--service-log (${SERVICE_LOG_ENV})") if service_log else None
    return search_server(base_url, log_text, max_num_seqs, plan, local_search(options, where), announce=announce)


def on_this_machine(files: list[Path], service_file: Path, param: list[str], plan: Any, options: RunOptions,
                    where: SearchedWhere, announce: Callable[[str], None]) -> Any:
    from harness.launch.specs import parse_param_options
    from harness.search.local import configurations, search_configurations

    searched = configurations(files, service_file, parse_param_options(param))
    return search_configurations(searched, plan, local_search(options, where), announce=announce)


def on_api(files: list[Path], service_file: Path, param: list[str], plan: Any, options: RunOptions,
           where: SearchedWhere, announce: Callable[[str], None], choices: ApiChoices) -> Any:
    """Services and harness jobs on the API in --project; the job is checked with its values before any
    service is created."""
    from harness.inventory.frozen import load_inventory
    from harness.launch.specs import parse_param_options
    from harness.launch.sweep import check_harness_params
    from harness.measure.timeouts import positive_seconds
    from harness.polyaxon_project import check_queue
    from harness.search.facts import Sizing
    from harness.search.local import configurations
    from harness.search.remote import ApiSearch, search_on_api

    if choices.queue is not None:
        check_queue(choices.queue)
    positive_seconds(choices.running_deadline_s, "--running-deadline-s")
    positive_seconds(choices.harness_deadline_s, "--harness-deadline-s")
    params = parse_param_options(param)
    searched = configurations(files, service_file, params)
    for_service = set(searched[0].params)
    for_harness = {"inventory": str(options.inventory), "seed": plan.seed,
                   **({"max_tokens": options.max_tokens} if options.max_tokens else {}),
                   **{name: value for name, value in params.items() if name not in for_service}}
    check_harness_params(choices.harness_files, {**for_harness, plan.knob.value: 1})  # the load is each probe's
    api = ApiSearch(project=where.tracked_in, harness_files=choices.harness_files, harness_params=for_harness,
                    queue=choices.queue, running_deadline_s=choices.running_deadline_s,
                    harness_deadline_s=choices.harness_deadline_s, out=where.out)
    sizing = Sizing(inventory=load_inventory(options.inventory), max_tokens=options.max_tokens)
    return search_on_api(searched, plan, api, sizing, announce=announce)


def tell(result: Any, where: SearchedWhere) -> None:
    """The report written, the search tracked as a run of its own, every answer printed; exit 3 when a
    search stopped early."""
    from harness.search.report import track_search, write_report

    markdown, plots = write_report(result, where.out)
    configurations = result.in_order()
    for configuration in configurations:
        if len(configurations) > 1:
            print(f"{configuration.title}:")
        print("\n".join(configuration.lines), flush=True)
    run_uuid = track_search(result, {"search-md": markdown, **{plot.stem: plot for plot in plots}},
                            project=where.tracked_in, offline_root=where.offline_root)
    runs = f"its probes in {where.offline_root}" if where.offline_root else f"its probes in {where.tracked_in}"
    print(f"report: {markdown}; search run {run_uuid} and {runs}")
    if not result.complete:
        raise typer.Exit(EXIT_INVALID)
