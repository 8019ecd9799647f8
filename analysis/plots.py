"""The report's PNG plots, drawn with matplotlib's Agg canvas (no display, no pyplot state)."""

from __future__ import annotations

import io
import numbers

import pandas as pd
from matplotlib.figure import Figure

from analysis.compare import Comparison, shown_value
from harness.schema import Output

LATENCY_PANELS = (("time to first token", (Output.TTFT_MS_P50, Output.TTFT_MS_P99)),
                  ("time per output token", (Output.TPOT_MS_P50, Output.TPOT_MS_P99)))
DPI = 100
WIDE_RANGE_RATIO = 10  # limits swept over a decade or more (KV bytes, lengths) read better on a log axis


def latency_vs_limit_png(comparison: Comparison) -> bytes:
    """Latency percentiles per point: the mean of its repeats, bars from the fastest to the slowest."""
    figure = Figure(figsize=(9, 3.6), dpi=DPI, layout="constrained")
    points = comparison.points
    x, labels = _positions(list(points.index))
    for axes, (title, names) in zip(figure.subplots(1, 2), LATENCY_PANELS, strict=True):
        for name in names:
            if f"{name}_mean" not in points:
                continue
            mean, low, high = (points[f"{name}_{stat}"].astype(float) for stat in ("mean", "min", "max"))
            axes.errorbar(x, mean, yerr=[mean - low, high - mean], marker="o", capsize=3, label=name)
        axes.set_title(title)
        axes.set_xlabel(comparison.limit)
        axes.set_ylabel("ms")
        axes.set_ylim(bottom=0)
        if min(x) > 0 and max(x) / min(x) >= WIDE_RANGE_RATIO:
            axes.set_xscale("log")
        axes.set_xticks(x, labels)
        axes.minorticks_off()
        axes.legend()
    return _png(figure)


def server_series_png(series: pd.DataFrame, title: str) -> bytes:
    """Waiting and running requests (left axis) and KV cache usage (right axis) over the run."""
    figure = Figure(figsize=(9, 3), dpi=DPI, layout="constrained")
    axes = figure.subplots()
    for name in ("waiting_requests", "running_requests"):
        axes.plot(series["t_s"], series[name], drawstyle="steps-post", marker=".", label=name)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("s since the run started")
    axes.set_ylabel("requests")
    usage = axes.twinx()
    usage.plot(series["t_s"], series["kv_cache_usage_fraction"], color="tab:red", marker=".",
               label="kv_cache_usage_fraction")
    usage.set_ylim(0, 1.05)
    usage.set_ylabel("KV cache usage (fraction)")
    axes.set_title(title, fontsize=9)
    handles = axes.get_legend_handles_labels()[0] + usage.get_legend_handles_labels()[0]
    axes.legend(handles=handles, loc="upper left", fontsize=8)
    return _png(figure)


def throughput_vs_ttft_png(runs: pd.DataFrame, limit: str) -> bytes:
    """Each run's output throughput against its TTFT p99, labelled with its value of the limit."""
    figure = Figure(figsize=(6, 4), dpi=DPI, layout="constrained")
    axes = figure.subplots()
    plotted = [Output.TTFT_MS_P99, Output.OUTPUT_TOKENS_PER_S]
    measured = runs.dropna(subset=plotted) if Output.TTFT_MS_P99 in runs else runs.iloc[0:0]
    axes.scatter(measured.get(Output.TTFT_MS_P99, []), measured.get(Output.OUTPUT_TOKENS_PER_S, []))
    for _, row in measured.iterrows():
        axes.annotate(f"{limit}={shown_value(row[limit])}", (row[Output.TTFT_MS_P99], row[Output.OUTPUT_TOKENS_PER_S]),
                      textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.set_xlabel("ttft_ms_p99 (ms)")
    axes.set_ylabel("output_tokens_per_s (tokens/s)")
    return _png(figure)


def _positions(values: list[object]) -> tuple[list[float], list[str]]:
    """Numbers stand at their value; anything else (a dtype name, a flag) at evenly spaced slots."""
    labels = [shown_value(value) for value in values]
    reals = [value for value in values if isinstance(value, numbers.Real) and not isinstance(value, bool)]
    if len(reals) == len(values):
        return [float(value) for value in reals], labels
    return [float(index) for index in range(len(values))], labels


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
