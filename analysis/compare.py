"""Compare runs that differ in exactly one limit, after proving that they do.

A sweep only answers "what did this limit do" if everything else was held: the same prompts, seed, load
shape, model, revision, image and every other engine argument. The comparator checks every input the
runs carry and refuses, naming each difference, rather than attribute a confound to the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.table import Derived, RunTable
from harness.errors import HarnessError
from harness.schema import Input, Output

# Inputs that identify a run rather than configure it: every point of a sweep has its own service run.
IDENTITY_INPUTS = (Input.SERVICE_UUID,)
COMPARED_FIGURES = (
    Output.TTFT_MS_P50, Output.TTFT_MS_P99, Output.TPOT_MS_P50, Output.TPOT_MS_P99, Output.E2E_MS_P99,
    Output.REQUESTS_PER_S, Output.OUTPUT_TOKENS_PER_S, Output.PEAK_WAITING_REQUESTS, Derived.PEAK_RUNNING_REQUESTS,
    Output.PEAK_KV_CACHE_USAGE_FRACTION, Output.PREEMPTIONS_DURING_RUN, Output.KV_CACHE_TOKENS_LOGGED,
    Output.KV_CACHE_TOKENS_PREDICTED, Output.ENGINE_WAITING_REQUESTS_MEAN, Output.ENGINE_RUNNING_REQUESTS_MEAN,
    Output.ENGINE_QUEUE_MS_MEAN, Output.ENGINE_DECODE_MS_MEAN, Output.FRONTEND_SHARE, Output.BURST_TOKEN_FRACTION,
)
# A change between two points is real when the ranges of their repeats do not overlap; with one run a
# point has no range, so its changes cannot be told from run-to-run noise.
REAL, WITHIN_SPREAD, SPREAD_UNKNOWN = "real", "within spread", "spread unknown (one run)"
UUIDS_SHOWN_PER_VALUE = 3


@dataclass(frozen=True)
class Comparison:
    limit: str
    runs: pd.DataFrame  # the table's rows, ordered by the limit
    points: pd.DataFrame  # one row per limit value: n, run_uuids, and <figure>_mean/_min/_max
    held_fixed: dict[str, Any]


def compare_one_limit(table: RunTable, limit: str) -> Comparison:
    """Refuse unless the runs differ only in `limit`; then aggregate repeated runs of each point."""
    frame = table.frame
    if limit not in table.input_columns:
        raise HarnessError(f"unknown limit '{limit}': the runs' inputs are {', '.join(sorted(table.input_columns))}")
    missing = [uuid for uuid in frame.index if _absent(frame.at[uuid, limit])]
    if missing:
        raise HarnessError(f"limit '{limit}' is not an input of run(s) {', '.join(missing)}")
    differences = [
        described for column in table.input_columns
        if column != limit and column not in IDENTITY_INPUTS and (described := _difference(frame[column]))
    ]
    if differences:
        raise HarnessError(f"runs differ in more than '{limit}': {'; '.join(differences)}")
    held = {column: frame[column].iloc[0] for column in table.input_columns
            if column != limit and column not in IDENTITY_INPUTS and not _absent(frame[column].iloc[0])}
    runs = frame.assign(**{limit: _ordered_values(frame[limit])}).sort_values(limit, kind="stable")
    return Comparison(limit=limit, runs=runs, points=_aggregate(runs, limit), held_fixed=held)


def _ordered_values(values: pd.Series) -> pd.Series:
    """The limit's values, which the runs are ordered by: numbers (a run not yet compiled by Polyaxon holds a
    -P value as the text it was given, "8"), or all text, or all true/false; a mix cannot be ordered."""
    kinds: dict[str, list[str]] = {}
    ordered = values.map(_as_number)
    for uuid, value in ordered.items():
        kind = "true/false" if isinstance(value, bool) else "a number" if isinstance(value, int | float) \
            else "text" if isinstance(value, str) else "not a single value"
        kinds.setdefault(kind, []).append(f"{shown_value(value)} in run {uuid}")
    if len(kinds) > 1 or "not a single value" in kinds:
        shown = "; ".join(f"{kind}: {', '.join(runs[:UUIDS_SHOWN_PER_VALUE])}" for kind, runs in sorted(kinds.items()))
        raise HarnessError(f"limit '{values.name}' holds values that cannot be ordered ({shown})")
    return ordered


def _as_number(value: Any) -> Any:
    """A number written as text ("8", "0.9") as the number; anything else as it is."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            number = kind(value)
            finite = math.isfinite(number)
        except (ValueError, OverflowError):  # not a number, or an integer past any float
            continue
        return number if finite else value
    return value


def _difference(values: pd.Series) -> str | None:
    """`name: 4 in run a, b; 8 in run c` when the runs disagree on an input, else None; 8 given as the
    text "8" (a run Polyaxon has not compiled) is the same 8."""
    groups: dict[str, list[str]] = {}
    for uuid, value in values.items():
        groups.setdefault("missing" if _absent(value) else shown_value(_as_number(value)), []).append(str(uuid))
    if len(groups) < 2:
        return None
    shown = []
    for value, uuids in sorted(groups.items()):
        more = f" and {len(uuids) - UUIDS_SHOWN_PER_VALUE} more" if len(uuids) > UUIDS_SHOWN_PER_VALUE else ""
        shown.append(f"{value} in run {', '.join(uuids[:UUIDS_SHOWN_PER_VALUE])}{more}")
    return f"{values.name}: {'; '.join(shown)}"


def shown_value(value: Any) -> str:
    """A table column holding a missing value turns its integers into floats; show them as integers again."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def people_number(value: float) -> str:
    """A figure as a person reads it: 17,078 and 123.4 and 0.0123, never 1.708e+04 or 1.23e-02."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1 or value == 0:
        return f"{value:.4g}"
    return np.format_float_positional(value, precision=3, unique=False, fractional=False, trim="-")


def _absent(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _aggregate(runs: pd.DataFrame, limit: str) -> pd.DataFrame:
    """Mean, min and max of each figure over a point's repeats, with n and the UUIDs they came from."""
    figures = [name for name in COMPARED_FIGURES if name in runs.columns]
    numeric = runs[figures].apply(pd.to_numeric, errors="coerce")
    grouped = numeric.groupby(runs[limit], sort=True)
    points = pd.concat([grouped.mean().add_suffix("_mean"), grouped.min().add_suffix("_min"),
                        grouped.max().add_suffix("_max")], axis=1)
    points = points[[f"{name}_{stat}" for name in figures for stat in ("mean", "min", "max")]]
    uuids = runs.index.to_series().groupby(runs[limit], sort=True)
    points.insert(0, "run_uuids", uuids.apply(", ".join))
    points.insert(0, "n", uuids.size())
    points.index.name = limit
    return points


def point_differences(comparison: Comparison, figures: tuple[str, ...]) -> pd.DataFrame:
    """Each figure from one point to the next: the change of the means, and whether it exceeds the spread."""
    points, rows = comparison.points, []
    for (low, a), (high, b) in zip(points.iterrows(), list(points.iterrows())[1:], strict=False):
        for name in figures:
            if f"{name}_mean" not in points or pd.isna(a[f"{name}_mean"]) or pd.isna(b[f"{name}_mean"]):
                continue
            if a["n"] < 2 or b["n"] < 2:
                called = SPREAD_UNKNOWN
            else:
                apart = a[f"{name}_max"] < b[f"{name}_min"] or b[f"{name}_max"] < a[f"{name}_min"]
                called = REAL if apart else WITHIN_SPREAD
            rows.append({"figure": name, comparison.limit: f"{shown_value(low)} → {shown_value(high)}",
                         "mean": f"{people_number(a[f'{name}_mean'])} → {people_number(b[f'{name}_mean'])}",
                         "difference": called})
    return pd.DataFrame(rows, columns=["figure", comparison.limit, "mean", "difference"])
