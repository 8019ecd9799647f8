"""One pandas table keyed by run UUID: inputs and outputs as columns, each run's metric series beside it.

A harness run that measured a separate service run (its `service_uuid` input) takes the service run's
limits and captured capacity when the service run is in the same source; the service run itself then
drops out, since it measured nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pandas as pd

from analysis.sources import SourcedRun
from harness.errors import HarnessError
from harness.measure.figures import RUNNING_SERIES, TurnFigures
from harness.schema import Input, Output
from harness.units import abbreviated


class Derived(StrEnum):
    """Figures the analysis derives from a run's row, declared once: no record gives them."""

    PEAK_RUNNING_REQUESTS = "peak_running_requests"  # the largest running_requests series value
    KV_TOKENS_NEEDED_PADDED = "kv_tokens_needed_padded"  # what the cache must hold at once, in whole blocks
    KV_CACHE_TOKENS_USABLE = "kv_cache_tokens_usable"  # the logged blocks less vLLM's reserved null block
    TTFT_MS_P99_GROWTH = "ttft_ms_p99_growth"  # against the comparison's baseline run
    TPOT_MS_P50_GROWTH = "tpot_ms_p50_growth"


GROWTH = {Output.TTFT_MS_P99: Derived.TTFT_MS_P99_GROWTH, Output.TPOT_MS_P50: Derived.TPOT_MS_P50_GROWTH}
MAX_FIGURE = 2**63 - 1  # a whole figure past a 64-bit integer fits no column of the table: its record is damaged


@dataclass(frozen=True)
class RunTable:
    frame: pd.DataFrame  # index: run UUID
    input_columns: list[str]
    series: dict[str, pd.DataFrame]
    origins: dict[str, str]
    turns: dict[str, list[TurnFigures]]  # a run's conversations per turn number; empty for other runs


def build_table(runs: Sequence[SourcedRun]) -> RunTable:
    by_uuid: dict[str, SourcedRun] = {}
    for run in runs:
        if run.run_uuid in by_uuid:
            raise HarnessError(f"run {run.run_uuid} found twice: {by_uuid[run.run_uuid].origin} and {run.origin}")
        by_uuid[run.run_uuid] = run
    services = {run.inputs.get(Input.SERVICE_UUID) for run in runs} & by_uuid.keys()
    rows: dict[str, dict[str, Any]] = {}
    input_columns: dict[str, None] = {}
    for run in runs:
        if run.run_uuid in services:
            continue
        service = by_uuid.get(run.inputs.get(Input.SERVICE_UUID, ""))
        inputs = {**service.inputs, **run.inputs} if service else run.inputs
        outputs = {**service.outputs, **run.outputs} if service else dict(run.outputs)
        running = run.series[RUNNING_SERIES].dropna() if RUNNING_SERIES in run.series else pd.Series()
        if not running.empty:
            outputs[Derived.PEAK_RUNNING_REQUESTS] = int(running.max())
        input_columns.update(dict.fromkeys(inputs))
        rows[run.run_uuid] = _tabulable({**inputs, **outputs}, run.origin)
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "run_uuid"
    return RunTable(frame=frame, input_columns=list(input_columns),
                    series={uuid: by_uuid[uuid].series for uuid in rows},
                    origins={uuid: by_uuid[uuid].origin for uuid in rows},
                    turns={uuid: by_uuid[uuid].turns for uuid in rows})


def _tabulable(figures: dict[str, Any], origin: str) -> dict[str, Any]:
    """The run's row, refused naming the figure when one is a whole number no table column holds, or infinite
    (JSON has no infinity: a reader made it of digits past any float)."""
    for name, value in figures.items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_FIGURE:
            raise HarnessError(f"{origin}: {name} is {abbreviated(str(value))}, past any figure a run records (a "
                               "64-bit integer); the record is damaged")
        if isinstance(value, float) and math.isinf(value):
            raise HarnessError(f"{origin}: {name} is infinite, which no run records; the record is damaged")
    return figures
