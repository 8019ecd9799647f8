"""One pandas table keyed by run UUID: inputs and outputs as columns, each run's metric series beside it.

A harness run that measured a separate service run (its `service_uuid` input) takes the service run's
limits and captured capacity when the service run is in the same source; the service run itself then
drops out, since it measured nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.sources import SourcedRun
from harness.errors import HarnessError

PEAK_RUNNING = "peak_running_requests"


@dataclass(frozen=True)
class RunTable:
    frame: pd.DataFrame  # index: run UUID
    input_columns: list[str]
    series: dict[str, pd.DataFrame]
    origins: dict[str, str]


def build_table(runs: Sequence[SourcedRun]) -> RunTable:
    by_uuid: dict[str, SourcedRun] = {}
    for run in runs:
        if run.run_uuid in by_uuid:
            raise HarnessError(f"run {run.run_uuid} found twice: {by_uuid[run.run_uuid].origin} and {run.origin}")
        by_uuid[run.run_uuid] = run
    services = {run.inputs.get("service_uuid") for run in runs} & by_uuid.keys()
    rows: dict[str, dict[str, Any]] = {}
    input_columns: dict[str, None] = {}
    for run in runs:
        if run.run_uuid in services:
            continue
        service = by_uuid.get(run.inputs.get("service_uuid", ""))
        inputs = {**service.inputs, **run.inputs} if service else run.inputs
        outputs = {**service.outputs, **run.outputs} if service else dict(run.outputs)
        running = run.series["running_requests"].dropna() if "running_requests" in run.series else pd.Series()
        if not running.empty:
            outputs[PEAK_RUNNING] = int(running.max())
        input_columns.update(dict.fromkeys(inputs))
        rows[run.run_uuid] = {**inputs, **outputs}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "run_uuid"
    return RunTable(frame=frame, input_columns=list(input_columns),
                    series={uuid: by_uuid[uuid].series for uuid in rows},
                    origins={uuid: by_uuid[uuid].origin for uuid in rows})
