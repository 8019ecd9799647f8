"""The live-token population each run's record predicted for its load, beside what the run measured.

The prediction was made when the run ended (`harness.measure.population_figures`), from the inventory, the
requests in flight and the engine's blocks; here it is only shown, in numbers a person reads: 5,120, not
5120.0.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from analysis.compare import people_number
from harness.schema import Output

POPULATION_FIGURES = (
    Output.POPULATION_LIVE_REQUESTS, Output.POPULATION_USABLE_BLOCKS, Output.POPULATION_BLOCK_SIZE_TOKENS,
    Output.POPULATION_PADDED_TOKENS_P50_PREDICTED, Output.POPULATION_PADDED_TOKENS_P99_PREDICTED,
    Output.POPULATION_PADDED_TOKENS_MAX_PREDICTED, Output.POPULATION_FIT_SHARE_PREDICTED,
    Output.POPULATION_PEAK_TOKENS_MEASURED, Output.PEAK_KV_CACHE_USAGE_FRACTION, Output.PREEMPTIONS_DURING_RUN,
)
POPULATION_TEXT = ("the block-padded live tokens of the requests in flight (prompt + output cap each, drawn from "
                   "the inventory, at most max_num_seqs of them) the calculator predicted for the run's load, "
                   "against the engine's usable blocks, beside the peak KV usage and the preemptions the run "
                   "measured; with prefix caching on, shared blocks are held once, so the peak may sit below")


def population_table(runs: pd.DataFrame, limit: str) -> pd.DataFrame:
    """One row per run: its UUID, its value of the limit, then the figures formatted for people."""
    rows = runs.reindex(columns=[limit, *POPULATION_FIGURES])
    shown = pd.DataFrame({name: [_people(value) for value in rows[name]] for name in POPULATION_FIGURES},
                         index=rows.index)
    shown.insert(0, limit, rows[limit])
    shown.insert(0, "run_uuid", rows.index)
    return shown.reset_index(drop=True)


def _people(value: Any) -> str | None:
    """Whole numbers with thousands separators, others as `people_number` gives them; None when missing."""
    if value is None or isinstance(value, str):
        return value
    number = float(value)
    if math.isnan(number):
        return None
    return f"{int(number):,}" if number.is_integer() else people_number(number)
