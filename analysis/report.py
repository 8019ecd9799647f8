"""`harness report`: one comparison as Markdown (plots beside it) and as one self-contained HTML page.

Both carry the same content: what was held fixed, each point of the sweep with its spread, every run
with its UUID, predicted against logged capacity, which limit bound each run and why, and the plots.
"""

from __future__ import annotations

import base64
import html
import math
import numbers
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.compare import (
    Comparison,
    compare_one_limit,
    people_number,
    point_differences,
    shown_value,
)
from analysis.diagnose import (
    CLIENT,
    COMPUTE,
    FRONTEND,
    KV_CAPACITY,
    NO_LIMIT,
    SCHEDULING,
    SERVER_FAILED,
    WEIGHTS,
    Verdict,
    diagnose_runs,
)
from analysis.plots import (
    latency_vs_limit_png,
    server_series_png,
    throughput_vs_ttft_png,
)
from analysis.population import POPULATION_TEXT, population_table
from analysis.sources import DEFAULT_API_LIMIT, collect_runs
from analysis.table import Derived, RunTable, build_table
from harness.errors import HarnessError
from harness.measure.figures import TurnFigures
from harness.paths import output_directory
from harness.redact import redact_text
from harness.schema import Input, Output

RUN_FIGURES = (
    Output.TTFT_MS_P50, Output.TTFT_MS_P99, Output.TPOT_MS_P50, Output.TPOT_MS_P99, Output.REQUESTS_PER_S,
    Output.OUTPUT_TOKENS_PER_S, Output.PEAK_WAITING_REQUESTS, Derived.PEAK_RUNNING_REQUESTS,
    Output.PEAK_KV_CACHE_USAGE_FRACTION, Output.PREEMPTIONS_DURING_RUN, Output.ERROR_RATE_FRACTION, Output.VALID,
)
CAPACITY_FIGURES = (
    Output.KV_CACHE_TOKENS_PREDICTED, Output.KV_CACHE_TOKENS_LOGGED, Output.MAX_CONCURRENCY_PREDICTED,
    Output.MAX_CONCURRENCY_LOGGED, Output.NUM_BLOCKS_PREDICTED, Output.NUM_BLOCKS_LOGGED, Output.PREDICTION_MATCHES_LOG,
)
DRIFT_FIGURES = (  # the before-launch prediction for each run's engine beside what it logged
    Output.KV_CACHE_TOKENS_BEFORE_LAUNCH, Output.KV_CACHE_TOKENS_LOGGED, Output.KV_CACHE_TOKENS_DRIFT_SHARE,
    Output.DRIFT_TERM,
)
DRIFT_TERMS = (  # each term before launch and as logged, one column per term
    (Output.WEIGHTS_BYTES_BEFORE_LAUNCH, Output.WEIGHTS_BYTES_LOGGED),
    (Output.ACTIVATION_PEAK_BYTES_BEFORE_LAUNCH, Output.ACTIVATION_PEAK_BYTES_LOGGED),
    (Output.NON_TORCH_BYTES_BEFORE_LAUNCH, Output.NON_TORCH_BYTES_LOGGED),
    (Output.CUDA_GRAPHS_BYTES_BEFORE_LAUNCH, Output.CUDA_GRAPHS_BYTES_LOGGED),
    (Output.KV_MEMORY_BYTES_BEFORE_LAUNCH, Output.KV_MEMORY_BYTES_LOGGED),
)
POINT_FIGURES = (
    Output.TTFT_MS_P99, Output.TPOT_MS_P50, Output.OUTPUT_TOKENS_PER_S, Output.ENGINE_WAITING_REQUESTS_MEAN,
    Output.ENGINE_RUNNING_REQUESTS_MEAN, Output.PEAK_KV_CACHE_USAGE_FRACTION, Output.PREEMPTIONS_DURING_RUN,
    Output.FRONTEND_SHARE, Output.BURST_TOKEN_FRACTION,
)
ENGINE_FIGURES = (
    Output.ENGINE_QUEUE_MS_MEAN, Output.ENGINE_PREFILL_MS_MEAN, Output.ENGINE_DECODE_MS_MEAN, Output.ENGINE_ITL_MS_MEAN,
    Output.CLIENT_E2E_MS_MEAN, Output.FRONTEND_MS_MEAN, Output.FRONTEND_SHARE, Output.BURST_TOKEN_FRACTION,
    Output.LARGEST_BURST_TOKENS, Output.PER_TOKEN_LATENCY_PACED, Output.QUALIFICATIONS,
)
PREFIX_CACHE_FIGURES = (
    Output.PREFIX_CACHE_HIT_TOKENS_PREDICTED, Output.PREFIX_CACHE_HIT_TOKENS_MEASURED,
    Output.PREFIX_CACHE_HITS_AS_PREDICTED,
)
MISSING = "–"
ADVICE = {  # what to change when a point is bound by each limit the diagnosis names
    WEIGHTS: "give the engine room to start: a lower max_model_len, a higher gpu_memory_utilization, "
             "or more GPU memory",
    SERVER_FAILED: "fix the server first: its requests failed (see the error classes), no limit was measured",
    CLIENT: "fix the measurement first: the client, not the server, limited this run",
    KV_CAPACITY: "more KV cache: raise gpu_memory_utilization or kv_cache_memory_bytes, use an fp8 kv_cache_dtype, "
                 "or send fewer requests at once",
    SCHEDULING: "raise max_num_seqs: requests waited while KV cache was free",
    FRONTEND: "the API server, not the engine, set the latency: more API servers (--api-server-count), a larger "
              "--stream-interval, or fewer streams per server",
    COMPUTE: "more compute: a larger tensor_parallel_size or a faster GPU; a higher limit only adds queueing",
    NO_LIMIT: "nothing bound it: send more load to find the limit",
}
# Wide tables wrap inside the page instead of running off its right edge: names break after their
# underscores and paths after their slashes (<wbr>), run UUIDs anywhere (monospace, so they stay legible).
PAGE_STYLE = ("body{font-family:sans-serif;margin:1.5em auto;max-width:80em;padding:0 1em;line-height:1.35}"
              "table{border-collapse:collapse;font-size:13px;width:100%}"
              "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;"
              "overflow-wrap:break-word}th{background:#f4f4f4}"
              "td.id{font-family:monospace;font-size:12px;word-break:break-all}img{max-width:100%;height:auto}")
UNITS = {  # headers whose names do not carry their unit; the rest already do (ttft_ms_p99, output_tokens_per_s)
    "n": "runs", Input.MAX_NUM_SEQS: "sequences", Input.MAX_MODEL_LEN: "tokens", Input.CONCURRENCY: "requests",
    Output.PEAK_WAITING_REQUESTS: "requests", Derived.PEAK_RUNNING_REQUESTS: "requests",
    Output.PREEMPTIONS_DURING_RUN: "preemptions",
    Output.MAX_CONCURRENCY_PREDICTED: "requests", Output.MAX_CONCURRENCY_LOGGED: "requests",
    Output.NUM_BLOCKS_PREDICTED: "blocks", Output.NUM_BLOCKS_LOGGED: "blocks", Input.BLOCK_SIZE: "tokens",
    Input.TENSOR_PARALLEL_SIZE: "GPUs",
    Input.GPU_MEMORY_UTILIZATION: "fraction",
    Output.REQUESTS_OK: "requests",
}


@dataclass(frozen=True)
class Plot:
    file_name: str
    caption: str
    png: bytes


@dataclass(frozen=True)
class Section:
    title: str
    text: str = ""
    table: pd.DataFrame | None = None
    plots: Sequence[Plot] = ()


@dataclass(frozen=True)
class WrittenReport:
    markdown: Path
    html: Path
    runs: pd.DataFrame  # the compared runs, one row per run UUID
    verdicts: list[Verdict]


def write_report(
    *,
    limit: str,
    out: Path,
    run_dirs: Sequence[Path] = (),
    offline_root: Path | None = None,
    project: str | None = None,
    query: str | None = None,
    api_limit: int = DEFAULT_API_LIMIT,
) -> WrittenReport:
    """Read every source, compare along `limit`, diagnose each run, and write report.md and report.html."""
    if out.exists() and not out.is_dir():
        raise HarnessError(f"--out {out}: is a file; the report needs a directory")
    output_directory(out, "--out")
    table = build_table(collect_runs(run_dirs, offline_root, project, query, api_limit))
    comparison = compare_one_limit(table, limit)
    verdicts = diagnose_runs(comparison.runs, limit)
    sections = report_sections(table, comparison, verdicts)
    title = f"Sweep of {limit}: {len(comparison.runs)} runs, {len(comparison.points)} points"
    out.mkdir(parents=True, exist_ok=True)
    for section in sections:
        for plot in section.plots:
            (out / plot.file_name).write_bytes(plot.png)
    markdown, page = out / "report.md", out / "report.html"
    markdown.write_text(redact_text(render_markdown(title, sections)), encoding="utf-8")  # records from before
    page.write_text(redact_text(render_html(title, sections)), encoding="utf-8")  # masking may hold a secret
    return WrittenReport(markdown=markdown, html=page, runs=comparison.runs, verdicts=verdicts)


def report_sections(table: RunTable, comparison: Comparison, verdicts: Sequence[Verdict]) -> list[Section]:
    limit, runs = comparison.limit, comparison.runs
    held = pd.DataFrame({"input": [header_with_unit(name) for name in comparison.held_fixed],
                         "value": [_setting(value) for value in comparison.held_fixed.values()]})
    points = comparison.points
    point_columns: dict[str, list[Any]] = {
        limit: [shown_value(value) for value in points.index], "n": points["n"].to_list(),
        **{name: [_spread(row, name) for _, row in points.iterrows()] for name in POINT_FIGURES
           if f"{name}_mean" in points},
        "run_uuids": points["run_uuids"].to_list()}
    point_rows = pd.DataFrame(point_columns)
    by_uuid = {verdict.run_uuid: verdict for verdict in verdicts}
    diagnosis = pd.DataFrame({"run_uuid": list(runs.index), limit: [shown_value(v) for v in runs[limit]],
                              "bound by": [by_uuid[uuid].bound_by for uuid in runs.index],
                              "evidence": ["; ".join(by_uuid[uuid].evidence) for uuid in runs.index]})
    series_plots = [
        Plot(f"series-{uuid}.png", f"run {uuid} ({limit}={shown_value(runs.at[uuid, limit])})",
             server_series_png(table.series[uuid], f"run {uuid}, {limit}={shown_value(runs.at[uuid, limit])}"))
        for uuid in runs.index if not table.series[uuid].empty
    ]
    return [
        Section("Answer", "", answer_table(runs, limit, verdicts)),
        Section("Held fixed", "" if len(held) else "nothing else was recorded as an input",
                held if len(held) else None),
        Section(f"Points of {limit}", "each figure: mean [min, max] over the point's runs", point_rows),
        differences_section(comparison),
        Section("Runs", "", _run_table(runs, limit, RUN_FIGURES)),
        Section("Where the time went", "vLLM's own histograms over the run (queue, prefill, decode, inter-token) "
                "beside the client's end-to-end time; the front end is the rest (API server, HTTP, client). "
                "When tokens arrived in bursts, TPOT and ITL are not per-token figures",
                _run_table(runs, limit, ENGINE_FIGURES)),
        Section("Predicted vs logged capacity", "the calculator's prediction beside what the engine logged at start-up",
                _run_table(runs, limit, CAPACITY_FIGURES)),
        Section("Before launch vs logged, per term", "the calculator's prediction before launch (the model's config, "
                "engine.json's limits, device.json's GPU) beside what the engine logged; a drift of the KV tokens "
                "over 2% qualifies the run and names the term most likely off (– where the log does not state it)",
                drift_table(runs, limit)),
        Section("Predicted vs measured prefix-cache hits", "the hit tokens the inventory's shared prefixes should "
                "give in whole blocks, beside the growth of vLLM's vllm:prefix_cache_hits over the run",
                _run_table(runs, limit, PREFIX_CACHE_FIGURES)),
        *turns_section(table, runs, limit),
        Section("Predicted vs measured live-token population", POPULATION_TEXT, population_table(runs, limit)),
        Section("Diagnosis", "which limit bound each run, with the figures that say so", diagnosis),
        Section("Latency vs " + limit, "", plots=[Plot("latency.png", f"latency percentiles vs {limit}",
                                                       latency_vs_limit_png(comparison))]),
        Section("Throughput vs TTFT", "", plots=[Plot("throughput-vs-ttft.png", "output throughput vs TTFT p99",
                                                      throughput_vs_ttft_png(runs, limit))]),
        Section("Server state over time", "waiting, running and KV cache usage as /metrics reported them",
                plots=series_plots),
    ]


def turns_section(table: RunTable, runs: pd.DataFrame, limit: str) -> list[Section]:
    """One row per run and turn number, for the runs that sent conversations; no section when none did."""
    rows = [{"run_uuid": uuid, limit: shown_value(runs.at[uuid, limit]), **turn.model_dump()}
            for uuid in runs.index for turn in table.turns.get(uuid, [])]
    if not rows:
        return []
    return [Section("Conversations turn by turn", "each turn number over a run's conversations: the requests that "
                    "succeeded, their mean prompt (the history included), their TTFT, the prefix-cache hits predicted "
                    "and the prompt tokens the responses reported served from the cache (where the server reported "
                    "them)", pd.DataFrame(rows, columns=["run_uuid", limit, *TurnFigures.model_fields]))]


def differences_section(comparison: Comparison) -> Section:
    """Each figure's change between points, called real only beyond its spread; said once when no point has one."""
    title = f"Differences between points of {comparison.limit}"
    repeats = "(`harness demo --repeats N`, or repeated points in a sweep)"
    if (comparison.points["n"] < 2).all():
        return Section(title, f"no point was measured more than once, so no figure's spread is known and no "
                       f"change between points can be called real {repeats}")
    return Section(title, f"a change is called real only when the ranges of the two points' repeats do not overlap "
                   f"{repeats}", point_differences(comparison, POINT_FIGURES))


def answer_table(runs: pd.DataFrame, limit: str, verdicts: Sequence[Verdict]) -> pd.DataFrame:
    """Per point of the limit, in words: what bound it, the figures that show it, and what to change."""
    by_uuid = {verdict.run_uuid: verdict for verdict in verdicts}
    rows = []
    for value, point in runs.groupby(limit, sort=True, dropna=False):
        point_verdicts = [by_uuid[uuid] for uuid in point.index if uuid in by_uuid]
        bound = Counter(verdict.bound_by for verdict in point_verdicts).most_common()
        first = next(verdict for verdict in point_verdicts if verdict.bound_by == bound[0][0])
        rows.append({
            limit: shown_value(value),
            "bound by": "; ".join(f"{name} ({count} of {len(point_verdicts)} runs)" if len(bound) > 1 else name
                                  for name, count in bound),
            "shown by": "; ".join(first.evidence[:3]) or MISSING,
            "what to change": ADVICE.get(first.bound_by, MISSING),
        })
    return pd.DataFrame(rows, columns=[limit, "bound by", "shown by", "what to change"])


def drift_table(runs: pd.DataFrame, limit: str) -> pd.DataFrame:
    """The drift figures, then each term as `before launch / logged` in MiB (– where a side is missing)."""
    table = _run_table(runs, limit, DRIFT_FIGURES)
    for predicted, logged in DRIFT_TERMS:
        term = predicted.removesuffix("_bytes_before_launch")
        table[f"{term}_mib before launch / logged"] = [
            f"{_mib(runs.at[uuid, predicted] if predicted in runs else None)} / "
            f"{_mib(runs.at[uuid, logged] if logged in runs else None)}" for uuid in runs.index]
    return table


def _mib(value: Any) -> str:
    return MISSING if value is None or pd.isna(value) else f"{value / 2**20:,.1f}"


def _setting(value: Any) -> str:
    """A held-fixed value as a person reads it: no quotes, and a home directory shown as ~."""
    shown = value if isinstance(value, str) else shown_value(value)
    home = str(Path.home())
    return "~" + shown[len(home):] if shown.startswith(home + "/") else shown


def _run_table(runs: pd.DataFrame, limit: str, figures: Sequence[str]) -> pd.DataFrame:
    rows = runs.reindex(columns=[limit, *figures])
    rows.insert(0, "run_uuid", rows.index)
    return rows.reset_index(drop=True)


def _spread(point: pd.Series, name: str) -> str:
    mean, low, high = (point[f"{name}_{stat}"] for stat in ("mean", "min", "max"))
    if pd.isna(mean):
        return MISSING
    return _cell(mean) if point["n"] == 1 else f"{_cell(mean)} [{_cell(low)}, {_cell(high)}]"


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and not float(value).is_integer():
        return people_number(float(value))
    return shown_value(value)


def header_with_unit(name: str) -> str:
    return f"{name} ({UNITS[name]})" if name in UNITS else name


def render_markdown(title: str, sections: Sequence[Section]) -> str:
    lines = [f"# {title}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.text:
            lines += [section.text, ""]
        if section.table is not None:
            header = [header_with_unit(str(column)) for column in section.table.columns]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            for row in section.table.itertuples(index=False):
                lines.append("| " + " | ".join(_cell(value).replace("|", "\\|") for value in row) + " |")
            lines.append("")
        for plot in section.plots:
            lines += [f"![{plot.caption}]({plot.file_name})", ""]
    return "\n".join(lines)


def _breakable(text: str) -> str:
    """Escaped, with a line-break opportunity after each underscore, slash and '=' of long names and paths."""
    escaped = html.escape(text)
    for mark in ("_", "/", "="):
        escaped = escaped.replace(mark, mark + "<wbr>")
    return escaped


def render_html(title: str, sections: Sequence[Section]) -> str:
    """One page with the plots inlined as base64 PNGs, so it can be mailed or attached as it is."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             f"<style>{PAGE_STYLE}</style>",
             f"</head><body><h1>{html.escape(title)}</h1>"]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.text:
            parts.append(f"<p>{html.escape(section.text)}</p>")
        if section.table is not None:
            parts.append(_html_table(section.table))
        for plot in section.plots:
            encoded = base64.b64encode(plot.png).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(plot.caption)}' src='data:image/png;base64,{encoded}'>"
                         f"<figcaption>{html.escape(plot.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _html_table(table: pd.DataFrame) -> str:
    """A section's table, a header row with units, then one row per record; id columns get their own class."""
    columns = [str(column) for column in table.columns]
    header = "".join(f"<th>{_breakable(header_with_unit(column))}</th>" for column in columns)
    cells = ["<td class='id'>" if column.endswith(("uuid", "uuids")) else "<td>" for column in columns]
    body = "".join(_html_row(cells, row) for row in table.itertuples(index=False))
    return f"<table><tr>{header}</tr>{body}</table>"


def _html_row(cells: list[str], row: tuple) -> str:
    tds = "".join(f"{cell}{_breakable(_cell(value))}</td>" for cell, value in zip(cells, row, strict=True))
    return f"<tr>{tds}</tr>"
