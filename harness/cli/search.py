"""`harness search`: the most load of a workload that meets an objective, and why the knee sits there."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import typer

from harness.cli.app import app, one_line_errors
from harness.errors import EXIT_CODES_HELP, EXIT_INVALID, HarnessError

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
    try:
        return [PercentileObjective(latency=latency, percentile=percentile, limit_ms=limit)
                for latency, percentile, limit in given]
    except ValidationError as error:
        raise HarnessError(f"--slo: {error.errors()[0]['msg']} ({error.errors()[0]['input']})") from None


def knob_values(low: float, high: float, step: float, over: str) -> list[float]:
    if not 0 < low <= high or step <= 0:
        raise HarnessError(f"--low {low:g}, --high {high:g}, --step {step:g}: need 0 < low ≤ high and a positive step")
    count = int((high - low) / step + 1e-9) + 1
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


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def search(
    files: list[Path] = typer.Option(..., "-f", "--file", help="service polyaxonfile or sweep file, then presets"),
    service_file: Path = typer.Option(Path("polyaxonfiles/vllm-service.yaml"), "--service",
                                      help="the service a sweep file's points start"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
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
    project: str = typer.Option("local/vllm-harness", help="project the offline runs belong to"),
) -> None:
    """Find the most load that meets the objective, one engine per configuration, bracketed by the prediction."""
    from harness.errors import validate_options
    from harness.launch.engine_process import stop_on_sigterm
    from harness.launch.specs import parse_param_options
    from harness.measure.run_options import RunOptions
    from harness.measure.schedule import LoadShape
    from harness.paths import input_directory, input_file, output_directory
    from harness.polyaxon_project import parse_project
    from harness.search.driver import SearchPlan
    from harness.search.local import LocalSearch, configurations, search_configurations
    from harness.search.objective import AttainmentObjective
    from harness.search.probe import Knob
    from harness.search.report import track_search, write_report

    if over not in ("concurrency", "rate"):
        raise HarnessError(f"--over: {over!r} is neither concurrency nor rate")
    check_load_cap(over, max_concurrency)
    objectives = percentile_objectives(slo_ttft_ms_p99, slo_tpot_ms_p99, slo_e2e_ms_p99, slo)
    if attain_ttft_ms is not None or attain_tpot_ms is not None:
        objectives.append(AttainmentObjective(ttft_ms=attain_ttft_ms, tpot_ms=attain_tpot_ms,
                                              target_share=attain_share))
    if not objectives:
        raise HarnessError("give an objective: --slo-ttft-ms-p99 MS (or --slo-tpot-ms-p99, --slo-e2e-ms-p99, "
                           "--slo ttft_ms_p90=MS, --attain-ttft-ms MS)")
    for path in files:
        input_file(path, "--file")
    input_file(service_file, "--service")
    input_directory(inventory, "--inventory")
    output_directory(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise HarnessError(f"--out {out}: already holds files; give a new directory")
    parse_project(project)
    plan = SearchPlan(search_id=uuid.uuid4().hex[:12], knob=Knob(over), values=knob_values(low, high, step, over),
                      objectives=objectives, max_repeats=max_repeats, turnovers=turnovers, min_requests=min_requests,
                      max_concurrency=max_concurrency, cold=cold, seed=seed)
    # The load and the server are each probe's: a placeholder of each checks the rest of the options now.
    options = validate_options(RunOptions, dict(inventory=inventory, load=LoadShape(concurrency=1, seed=seed),
                                                base_url="http://127.0.0.1:1", max_tokens=max_tokens, cold=cold))
    searched = configurations(files, service_file, parse_param_options(param))
    local = LocalSearch(options=options, out=out, project=project, offline_root=out / "polyaxon")
    with stop_on_sigterm():
        result = search_configurations(searched, plan, local,
                                       announce=lambda line: print(line, file=sys.stderr, flush=True))
    markdown, plots = write_report(result, out)
    run_uuid = track_search(result, {"search-md": markdown, **{plot.stem: plot for plot in plots}},
                            project=project, offline_root=out / "polyaxon")
    for configuration in result.in_order():
        if len(searched) > 1:
            print(f"{configuration.title}:")
        print("\n".join(configuration.lines))
    print(f"report: {markdown}; search run {run_uuid} and its probes in {out / 'polyaxon'}")
    if not result.complete:
        raise typer.Exit(EXIT_INVALID)
