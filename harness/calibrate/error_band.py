"""The before-launch KV memory's error on the fit half: the band a fit call is "at risk" inside (cache_margin.py).

Each fit case that logs its KV memory on one pipeline stage, and says what its cache holds, is priced with the
fitted constants, as the field check prices it; |predicted − logged| KV memory over total × utilisation is its
error. The band is the 90th percentile of those errors, so a prediction misses by more about one time in ten.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.calibrate.field_corpus import FieldCase
from harness.calibrate.field_launch import engine_launch, gpu_total
from harness.errors import HarnessError
from harness.predict.memory_model import MemoryConstants, plan_waterfall

ERROR_BAND_QUANTILE = 0.9


def kv_error_share(cases: list[FieldCase], configs: dict[str, dict[str, Any]],
                   constants: MemoryConstants) -> tuple[float, list[str]]:
    """The band as a share of total × utilisation, and the cases it was measured on."""
    errors = {case.id: error for case in cases if (error := _error_share(case, configs, constants)) is not None}
    share = round(float(np.quantile(list(errors.values()), ERROR_BAND_QUANTILE)), 4) if errors else 0.0
    return share, sorted(errors)


def _error_share(case: FieldCase, configs: dict[str, dict[str, Any]], constants: MemoryConstants) -> float | None:
    config, total = configs.get(case.facts.config or ""), gpu_total(case)
    logged = case.parsed().available_kv_cache_bytes
    if config is None or total is None or logged is None or case.facts.pipeline_parallel_size > 1 \
            or not case.facts.cache_contents_stated:  # a drafter the excerpt leaves out would hold weights
        return None
    try:
        waterfall = plan_waterfall(config, constants, engine_launch(case), total_bytes=total[0],
                                   total_source=total[1], gpu_name=case.facts.gpu)
    except HarnessError:  # a checkpoint format the weights are not priced for
        return None
    return abs(waterfall.kv_bytes - logged) / waterfall.usable_bytes
