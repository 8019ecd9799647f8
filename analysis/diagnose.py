"""Which limit bound each run, in a fixed order, each verdict citing the figures it used.

The order matters: a run whose engine never started has nothing else to say; a run whose client fell
behind did not measure the server; memory pressure (preemption, or a queue while the cache is full)
explains a queue before the sequence cap does; only a run with no queue at all can be compute-bound,
and only against a baseline from the same comparison.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.table import PEAK_RUNNING
from harness.record import DEFAULT_MAX_ERROR_FRACTION

WEIGHTS = "weights and start-up headroom"
SERVER_FAILED = "server dead or failing (requests failed)"
CLIENT = "measurement invalid (client)"
KV_CAPACITY = "KV cache capacity"
SCHEDULING = "max_num_seqs (scheduling)"
COMPUTE = "compute saturation"
NO_LIMIT = "no limit reached"

# vLLM admits a waiting request only when its prompt's blocks are free; a queue beside a cache this full
# is waiting for blocks. Scrapes are seconds apart and miss the peak, so the live-token test backs it up.
HIGH_KV_USAGE_FRACTION = 0.9
# One request waiting at a scrape is a request the engine could not start.
QUEUED_REQUESTS = 1
# Latency this many times the comparison's lowest-load point, with no queue, is the engine out of compute;
# smaller changes are within what scheduling noise on a shared machine does to a short run.
LATENCY_GROWTH_FACTOR = 2.0
LATENCY_FIGURES = ("ttft_ms_p99", "tpot_ms_p50")


@dataclass(frozen=True)
class Verdict:
    run_uuid: str
    bound_by: str
    evidence: list[str]  # `name=value` with the unit in the name or after the value

    @property
    def text(self) -> str:
        return f"{self.bound_by}: {'; '.join(self.evidence)}"


def diagnose_runs(runs: pd.DataFrame, limit: str | None = None) -> list[Verdict]:
    """Every run of one comparison, against the comparison's lowest-load run that measured anything."""
    baseline = lowest_load_run(runs)
    return [diagnose(str(uuid), row, None if baseline is None else runs.loc[baseline], limit)
            for uuid, row in runs.iterrows()]


def lowest_load_run(runs: pd.DataFrame) -> str | None:
    """The valid run with the least offered load, then the fewest sequences running at once."""
    measured = runs[[bool(_number(row, "requests_ok")) and _flag(row, "valid") is True for _, row in runs.iterrows()]]
    if measured.empty:
        return None
    keys = {uuid: (_number(row, "concurrency") or _number(row, "max_concurrency") or math.inf,
                   _number(row, "rate_per_s") or 0.0, _number(row, PEAK_RUNNING) or 0.0,
                   _number(row, "achieved_concurrency_mean") or 0.0)
            for uuid, row in measured.iterrows()}
    return str(min(keys, key=keys.__getitem__))


def diagnose(run_uuid: str, row: pd.Series, baseline: pd.Series | None, limit: str | None = None) -> Verdict:
    def verdict(bound_by: str, *evidence: str) -> Verdict:
        return Verdict(run_uuid=run_uuid, bound_by=bound_by, evidence=[item for item in evidence if item])

    if _flag(row, "engine_started") is False or _present(row, "engine_error"):
        return verdict(WEIGHTS, _cite(row, "engine_error"), _cite(row, "engine_failure_stage"),
                       _cite(row, "model_weights_bytes_logged"), _cite(row, "kv_cache_memory_bytes"),
                       _cite(row, "gpu_memory_utilization"))
    failed = failing_server(row)
    if failed is not None:
        return verdict(SERVER_FAILED, *failed)
    if not _present(row, "valid"):
        return verdict(CLIENT, "summary missing: the run recorded no figures")
    if _flag(row, "valid") is not True:
        return verdict(CLIENT, f"invalid_reasons={row.get('invalid_reasons')!r}", _cite(row, "dispatch_lag_ms_p99"),
                       _cite(row, "requests_ok"))

    preemptions = _number(row, "preemptions_during_run") or 0
    waiting = _number(row, "peak_waiting_requests") or 0
    kv_usage = _number(row, "peak_kv_cache_usage_fraction")
    live_tokens, live_evidence = live_token_population(row)
    kv_tokens = _number(row, "kv_cache_tokens_logged")
    cache_full = (kv_usage is not None and kv_usage >= HIGH_KV_USAGE_FRACTION) or (
        live_tokens is not None and kv_tokens is not None and live_tokens > kv_tokens)
    memory = [_cite(row, "preemptions_during_run"), _cite(row, "peak_kv_cache_usage_fraction"),
              _cite(row, "kv_cache_tokens_logged"), live_evidence]
    if preemptions > 0 or (waiting >= QUEUED_REQUESTS and cache_full):
        return verdict(KV_CAPACITY, *memory, _cite(row, "peak_waiting_requests"), _cite(row, PEAK_RUNNING),
                       _cite(row, "max_num_seqs"),
                       f"threshold: peak_kv_cache_usage_fraction>={HIGH_KV_USAGE_FRACTION} or live tokens above "
                       "kv_cache_tokens_logged")
    if waiting >= QUEUED_REQUESTS:
        return verdict(SCHEDULING, _cite(row, "peak_waiting_requests"), _cite(row, PEAK_RUNNING),
                       _cite(row, "max_num_seqs"), _cite(row, "concurrency"), *memory)

    if baseline is not None and baseline.name != run_uuid:
        grown = [(name, _number(row, name), _number(baseline, name)) for name in LATENCY_FIGURES]
        grown = [(name, value, base) for name, value, base in grown
                 if value is not None and base and value >= LATENCY_GROWTH_FACTOR * base]
        if grown:
            where = f"{limit}={baseline.get(limit)}" if limit else "its lowest load"
            return verdict(COMPUTE, *(f"{name}={value:.4g} vs {base:.4g} at baseline run {baseline.name} ({where})"
                                      for name, value, base in grown),
                           f"threshold: {LATENCY_GROWTH_FACTOR:g}x the baseline", _cite(row, "peak_waiting_requests"),
                           _cite(row, "peak_kv_cache_usage_fraction"), _cite(row, "preemptions_during_run"))
    return verdict(NO_LIMIT, _cite(row, "ttft_ms_p99"), _cite(row, "tpot_ms_p50"), _cite(row, "peak_waiting_requests"),
                   _cite(row, "peak_kv_cache_usage_fraction"), _cite(row, "preemptions_during_run"))


def failing_server(row: pd.Series) -> list[str] | None:
    """Evidence that the server, not a limit, ended the requests: failures above the run's error threshold.

    Refused, reset, stalled and timed-out requests are a dead or frozen server; 5xx a failing one.
    """
    rate = _number(row, "error_rate_fraction")
    threshold = _number(row, "max_error_fraction")
    if rate is None or rate <= (DEFAULT_MAX_ERROR_FRACTION if threshold is None else threshold):
        return None
    by_class = [_cite(row, name) for name in sorted(row.index) if str(name).startswith("errors_")
                and name != "errors_cancelled" and (_number(row, name) or 0) > 0]
    return [f"error_rate_fraction={rate:.3g}", *by_class, _cite(row, "requests_ok"), _cite(row, "requests_measured"),
            f"threshold: error_rate_fraction>{DEFAULT_MAX_ERROR_FRACTION if threshold is None else threshold:g}"]


def live_token_population(row: pd.Series) -> tuple[float | None, str]:
    """Sequences the engine may run at once × (mean prompt + mean output tokens): what its cache must hold.

    Requests beyond max_num_seqs wait without holding KV blocks, so they cannot make the cache the limit.
    """
    in_flight = _number(row, "concurrency") or _number(row, "max_concurrency") or _number(row, "achieved_concurrency_mean")
    if in_flight and _number(row, "max_num_seqs"):
        in_flight = min(in_flight, _number(row, "max_num_seqs"))
    per_s = _number(row, "requests_per_s")
    prompt_per_s, output_per_s = _number(row, "prompt_tokens_per_s"), _number(row, "output_tokens_per_s")
    if not in_flight or not per_s or prompt_per_s is None or output_per_s is None:
        return None, ""
    prompt, output = prompt_per_s / per_s, output_per_s / per_s
    live = in_flight * (prompt + output)
    return live, (f"live_tokens={live:.0f} tokens ({in_flight:g} sequences × (prompt {prompt:.0f} + "
                  f"output {output:.0f} tokens))")


def _cite(row: pd.Series, name: str) -> str:
    if not _present(row, name):
        return ""
    value, number = row[name], _number(row, name)
    if number is not None:
        return f"{name}={int(number)}" if number.is_integer() else f"{name}={number:.4g}"
    return f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"


def _present(row: pd.Series, name: str) -> bool:
    value = row.get(name)
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and value != ""


def _number(row: pd.Series, name: str) -> float | None:
    value = row.get(name)
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real) or math.isnan(value):
        return None
    return float(value)


def _flag(row: pd.Series, name: str) -> bool | None:
    """Booleans come back as numpy's from a table and as Python's from a dict."""
    value = row.get(name)
    return bool(value) if isinstance(value, bool | np.bool_) else None
