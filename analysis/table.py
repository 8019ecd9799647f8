"""One pandas table keyed by run UUID: inputs and outputs as columns, each run's metric series beside it.

A harness run that measured a separate service run (its `service_uuid` input) takes the service run's
limits and captured capacity when the service run is in the same source; the service run itself then
drops out, since it measured nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pandas as pd

from analysis.sources import SourcedRun
from harness.errors import HarnessError
from harness.measure.figures import RUNNING_SERIES, TurnFigures
from harness.schema import Input, Output


class Derived(StrEnum):
    """Figures the analysis derives from a run's row, declared once: no record gives them."""

    PEAK_RUNNING_REQUESTS = "peak_running_requests"  # the largest running_requests series value
    KV_TOKENS_NEEDED_PADDED = "kv_tokens_needed_padded"  # what the cache must hold at once, in whole blocks
    KV_CACHE_TOKENS_USABLE = "kv_cache_tokens_usable"  # the logged blocks less vLLM's reserved null block
    TTFT_MS_P99_GROWTH = "ttft_ms_p99_growth"  # against the comparison's baseline run
    TPOT_MS_P50_GROWTH = "tpot_ms_p50_growth"


GROWTH = {Output.TTFT_MS_P99: Derived.TTFT_MS_P99_GROWTH, Output.TPOT_MS_P50: Derived.TPOT_MS_P50_GROWTH}


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
        rows[run.run_uuid] = {**inputs, **outputs}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "run_uuid"
    return RunTable(frame=frame, input_columns=list(input_columns),
                    series={uuid: by_uuid[uuid].series for uuid in rows},
                    origins={uuid: by_uuid[uuid].origin for uuid in rows},
                    turns={uuid: by_uuid[uuid].turns for uuid in rows})
