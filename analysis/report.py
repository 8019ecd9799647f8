"""`harness report`: one comparison as Markdown (plots beside it) and as one self-contained HTML page.

Both carry the same content: what was held fixed, each point of the sweep with its spread, every run
with its UUID, predicted against logged capacity, which limit bound each run and why, and the plots.
"""

from __future__ import annotations

import base64
import html
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.compare import Comparison, compare_one_limit, point_differences, shown_value
from analysis.diagnose import Verdict, diagnose_runs
from analysis.plots import latency_vs_limit_png, server_series_png, throughput_vs_ttft_png
from analysis.sources import DEFAULT_API_LIMIT, collect_runs
from analysis.table import PEAK_RUNNING, RunTable, build_table
from harness.errors import HarnessError

RUN_FIGURES = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "requests_per_s", "output_tokens_per_s",
               "peak_waiting_requests", PEAK_RUNNING, "peak_kv_cache_usage_fraction", "preemptions_during_run",
               "error_rate_fraction", "valid")
CAPACITY_FIGURES = ("kv_cache_tokens_predicted", "kv_cache_tokens_logged", "max_concurrency_predicted",
                    "max_concurrency_logged", "num_blocks_predicted", "num_blocks_logged", "prediction_matches_log")
POINT_FIGURES = ("ttft_ms_p99", "tpot_ms_p50", "output_tokens_per_s", "engine_waiting_requests_mean",
                 "engine_running_requests_mean", "peak_kv_cache_usage_fraction", "preemptions_during_run",
                 "frontend_share", "burst_token_fraction")
ENGINE_FIGURES = ("engine_queue_ms_mean", "engine_prefill_ms_mean", "engine_decode_ms_mean", "engine_itl_ms_mean",
                  "client_e2e_ms_mean", "frontend_ms_mean", "frontend_share", "burst_token_fraction",
                  "largest_burst_tokens", "per_token_latency_paced", "qualifications")
MISSING = "–"


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
    markdown.write_text(render_markdown(title, sections), encoding="utf-8")
    page.write_text(render_html(title, sections), encoding="utf-8")
    return WrittenReport(markdown=markdown, html=page, runs=comparison.runs, verdicts=verdicts)


def report_sections(table: RunTable, comparison: Comparison, verdicts: Sequence[Verdict]) -> list[Section]:
    limit, runs = comparison.limit, comparison.runs
    held = ", ".join(f"{name}={shown_value(value)}" for name, value in comparison.held_fixed.items())
    points = comparison.points
    point_rows = pd.DataFrame(
        {limit: [shown_value(value) for value in points.index], "n": points["n"].to_list(),
         **{name: [_spread(row, name) for _, row in points.iterrows()] for name in POINT_FIGURES
            if f"{name}_mean" in points},
         "run_uuids": points["run_uuids"].to_list()})
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
        Section("Held fixed", held or "nothing else was recorded as an input"),
        Section(f"Points of {limit}", "each figure: mean [min, max] over the point's runs", point_rows),
        Section(f"Differences between points of {limit}",
                "a change is called real only when the ranges of the two points' repeats do not overlap "
                "(`harness demo --repeats N`, or repeated points in a sweep)",
                point_differences(comparison, POINT_FIGURES)),
        Section("Runs", "", _run_table(runs, limit, RUN_FIGURES)),
        Section("Where the time went", "vLLM's own histograms over the run (queue, prefill, decode, inter-token) "
                "beside the client's end-to-end time; the front end is the rest (API server, HTTP, client). "
                "When tokens arrived in bursts, TPOT and ITL are not per-token figures",
                _run_table(runs, limit, ENGINE_FIGURES)),
        Section("Predicted vs logged capacity", "the calculator's prediction beside what the engine logged at start-up",
                _run_table(runs, limit, CAPACITY_FIGURES)),
        Section("Diagnosis", "which limit bound each run, with the figures that say so", diagnosis),
        Section("Latency vs " + limit, "", plots=[Plot("latency.png", f"latency percentiles vs {limit}",
                                                       latency_vs_limit_png(comparison))]),
        Section("Throughput vs TTFT", "", plots=[Plot("throughput-vs-ttft.png", "output throughput vs TTFT p99",
                                                      throughput_vs_ttft_png(runs, limit))]),
        Section("Server state over time", "waiting, running and KV cache usage as /metrics reported them",
                plots=series_plots),
    ]


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
        return f"{float(value):.4g}"
    return shown_value(value)


def render_markdown(title: str, sections: Sequence[Section]) -> str:
    lines = [f"# {title}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.text:
            lines += [section.text, ""]
        if section.table is not None:
            header = [str(column) for column in section.table.columns]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            for row in section.table.itertuples(index=False):
                lines.append("| " + " | ".join(_cell(value).replace("|", "\\|") for value in row) + " |")
            lines.append("")
        for plot in section.plots:
            lines += [f"![{plot.caption}]({plot.file_name})", ""]
    return "\n".join(lines)


def render_html(title: str, sections: Sequence[Section]) -> str:
    """One page with the plots inlined as base64 PNGs, so it can be mailed or attached as it is."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}img{max-width:100%}</style>",
             f"</head><body><h1>{html.escape(title)}</h1>"]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.text:
            parts.append(f"<p>{html.escape(section.text)}</p>")
        if section.table is not None:
            header = "".join(f"<th>{html.escape(str(column))}</th>" for column in section.table.columns)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(value))}</td>" for value in row) + "</tr>"
                           for row in section.table.itertuples(index=False))
            parts.append(f"<table><tr>{header}</tr>{body}</table>")
        for plot in section.plots:
            encoded = base64.b64encode(plot.png).decode("ascii")
            parts.append(f"<figure><img alt='{html.escape(plot.caption)}' src='data:image/png;base64,{encoded}'>"
                         f"<figcaption>{html.escape(plot.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)
