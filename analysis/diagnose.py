"""Which limit bound each run: rules in a fixed order, each citing exactly the figures it decided on.

The order matters: a run whose engine never started has nothing else to say; a server whose requests
failed is named before any limit; a run whose client fell behind did not measure the server; memory
pressure (preemption, or a queue while the cache is full) explains a queue before the sequence cap does;
a front end that spent most of each request's time explains latency before compute does; only a run with
no queue can be compute-bound, and only against a baseline from the same comparison.

Every rule reads only the figures it cites, so a verdict's evidence implies the verdict under the
thresholds it states — checked for every rule in tests/analysis/test_analysis_diagnose.py. Queues are read from
vLLM's queue-time histogram (a request that waited shows there whether or not a scrape caught it), with
the sampled peak as a second witness; the live KV population is padded to whole blocks, as vLLM
allocates it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.table import GROWTH, Derived
from harness.measure.record import DEFAULT_MAX_ERROR_FRACTION
from harness.schema import Input, Output

WEIGHTS = "weights and start-up headroom"
SERVER_FAILED = "server dead or failing (requests failed)"
CLIENT = "measurement invalid (client)"
KV_CAPACITY = "KV cache capacity"
SCHEDULING = "max_num_seqs (scheduling)"
FRONTEND = "serving front end"
COMPUTE = "compute saturation"
NO_LIMIT = "no limit reached"

# vLLM admits a waiting request only when its prompt's blocks are free; a queue beside a cache this full
# is waiting for blocks.
HIGH_KV_USAGE_FRACTION = 0.9
# Little's law on the queue-time histogram: half a request waiting on average over the run is a queue
# that shaped it. A run the engine keeps up with queues for microseconds per request: 1e-3 at the most.
QUEUED_REQUESTS_MEAN = 0.5
# One request waiting at a scrape is a request the engine could not start.
QUEUED_REQUESTS_PEAK = 1
# The share of a request's end-to-end time spent outside the engine's queue, prefill and decode above
# which the API server, HTTP or the client, not the engine, decided the latency.
FRONTEND_SHARE = 0.5
# Latency this many times the comparison's lowest-load point, with no queue, is the engine out of compute;
# smaller changes are within what scheduling noise on a shared machine does to a short run.
LATENCY_GROWTH_FACTOR = 2.0
LATENCY_FIGURES = tuple(GROWTH)  # each compared with the baseline's as its `Derived` growth

Figures = Mapping[str, Any]


@dataclass(frozen=True)
class Rule:
    bound_by: str
    cites: tuple[str, ...]  # every figure `holds` may read
    holds: Callable[[Figures], bool]
    threshold: str


@dataclass(frozen=True)
class Verdict:
    run_uuid: str
    bound_by: str
    figures: dict[str, Any]  # the cited figures that the run has, by name (units in the names)
    threshold: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def evidence(self) -> list[str]:
        return [*(_shown(name, value) for name, value in self.figures.items()), *self.notes,
                *([f"threshold: {self.threshold}"] if self.threshold else [])]

    @property
    def text(self) -> str:
        return f"{self.bound_by}: {'; '.join(self.evidence)}"


def _queued(f: Figures) -> bool:
    return _at_least(f, Output.ENGINE_WAITING_REQUESTS_MEAN, QUEUED_REQUESTS_MEAN) or _at_least(
        f, Output.PEAK_WAITING_REQUESTS, QUEUED_REQUESTS_PEAK)


def _memory_bound(f: Figures) -> bool:
    needed, usable = _num(f, Derived.KV_TOKENS_NEEDED_PADDED), _num(f, Derived.KV_CACHE_TOKENS_USABLE)
    cache_full = _at_least(f, Output.PEAK_KV_CACHE_USAGE_FRACTION, HIGH_KV_USAGE_FRACTION) or (
        needed is not None and usable is not None and needed > usable)
    return (_num(f, Output.PREEMPTIONS_DURING_RUN) or 0) > 0 or (_queued(f) and cache_full)


def _failing(f: Figures) -> bool:
    rate, threshold = _num(f, Output.ERROR_RATE_FRACTION), _num(f, Output.MAX_ERROR_FRACTION)
    return rate is not None and rate > (DEFAULT_MAX_ERROR_FRACTION if threshold is None else threshold)


def _grown(f: Figures) -> bool:
    return any(_at_least(f, GROWTH[name], LATENCY_GROWTH_FACTOR) for name in LATENCY_FIGURES)


QUEUE = (Output.ENGINE_WAITING_REQUESTS_MEAN, Output.PEAK_WAITING_REQUESTS)
MEMORY = (Output.PREEMPTIONS_DURING_RUN, *QUEUE, Output.PEAK_KV_CACHE_USAGE_FRACTION, Derived.KV_TOKENS_NEEDED_PADDED,
          Output.KV_CACHE_TOKENS_LOGGED, Derived.KV_CACHE_TOKENS_USABLE)
SEQUENCES = (Input.MAX_NUM_SEQS, Input.CONCURRENCY, Output.ENGINE_RUNNING_REQUESTS_MEAN)
QUEUE_WORDS = (f"engine_waiting_requests_mean>={QUEUED_REQUESTS_MEAN} or "
               f"peak_waiting_requests>={QUEUED_REQUESTS_PEAK}")
RULES = (
    Rule(WEIGHTS, (Output.ENGINE_STARTED, Output.ENGINE_ERROR, Output.ENGINE_FAILURE_STAGE,
                   Output.MODEL_WEIGHTS_BYTES_LOGGED, Input.KV_CACHE_MEMORY_BYTES, Input.GPU_MEMORY_UTILIZATION),
         lambda f: f.get(Output.ENGINE_STARTED) is False or _present(f, Output.ENGINE_ERROR),
         "the engine did not start"),
    Rule(SERVER_FAILED,
         (Output.ERROR_RATE_FRACTION, Output.MAX_ERROR_FRACTION, Output.REQUESTS_OK, Output.REQUESTS_MEASURED),
         lambda f: _failing(f),
         "error_rate_fraction above the run's max_error_fraction: refused, reset, stalled and timed-out requests "
         "are a dead or frozen server, 5xx a failing one"),
    Rule(CLIENT, (Output.VALID, Output.INVALID_REASONS, Output.REQUESTS_OK, Output.DISPATCH_LAG_MS_P99,
                  Output.SEND_DELAY_MS_P99, Output.LOOP_STALL_SHARE, Output.LOOP_LAG_MS_MAX, Output.SAMPLE_GAP_S_MAX),
         lambda f: f.get(Output.VALID) is not True,
         "the run's own validity checks failed, or it recorded no summary"),
    Rule(KV_CAPACITY, (*MEMORY, *SEQUENCES), _memory_bound,
         f"preemptions_during_run>0, or a queue ({QUEUE_WORDS}) with peak_kv_cache_usage_fraction>="
         f"{HIGH_KV_USAGE_FRACTION} or kv_tokens_needed_padded>kv_cache_tokens_usable"),
    Rule(SCHEDULING, (*MEMORY, *SEQUENCES),
         lambda f: _queued(f) and not _memory_bound(f), f"a queue ({QUEUE_WORDS}) without memory pressure"),
    Rule(FRONTEND, (*MEMORY, Output.FRONTEND_SHARE, Output.FRONTEND_MS_MEAN, Output.CLIENT_E2E_MS_MEAN,
                    Output.ENGINE_QUEUE_MS_MEAN, Output.ENGINE_PREFILL_MS_MEAN, Output.ENGINE_DECODE_MS_MEAN,
                    Output.BURST_TOKEN_FRACTION),
         lambda f: not _memory_bound(f) and not _queued(f) and _at_least(f, Output.FRONTEND_SHARE, FRONTEND_SHARE),
         f"no queue, and frontend_share>={FRONTEND_SHARE} of client_e2e_ms_mean outside the engine"),
    Rule(COMPUTE, (*MEMORY, *(GROWTH[name] for name in LATENCY_FIGURES), *LATENCY_FIGURES),
         lambda f: not _memory_bound(f) and not _queued(f) and _grown(f),
         f"no queue, and a latency at least {LATENCY_GROWTH_FACTOR:g}x the comparison's baseline run"),
    Rule(NO_LIMIT,
         (Output.TTFT_MS_P99, Output.TPOT_MS_P50, Output.PER_TOKEN_LATENCY_PACED, *MEMORY, Output.FRONTEND_SHARE),
         lambda f: True, ""),
)


def diagnose_runs(runs: pd.DataFrame, limit: str | None = None) -> list[Verdict]:
    """Every run of one comparison, against the comparison's lowest-load run that measured anything."""
    baseline = lowest_load_run(runs)
    baseline_row = None if baseline is None else runs.loc[baseline]
    if isinstance(baseline_row, pd.DataFrame):  # a run table has one row per UUID
        raise ValueError(f"run {baseline} appears more than once in the comparison")
    return [diagnose(str(uuid), row, baseline_row, limit) for uuid, row in runs.iterrows()]


def lowest_load_run(runs: pd.DataFrame) -> str | None:
    """The valid run with the least offered load, then the fewest sequences running at once."""
    measured = runs[[bool(_num(row, Output.REQUESTS_OK)) and _flag(row, Output.VALID) is True
                     for _, row in runs.iterrows()]]
    if measured.empty:
        return None
    keys = {uuid: (_num(row, Input.CONCURRENCY) or _num(row, Input.MAX_CONCURRENCY) or math.inf,
                   _num(row, Input.RATE_PER_S) or 0.0, _num(row, Derived.PEAK_RUNNING_REQUESTS) or 0.0,
                   _num(row, Output.ACHIEVED_CONCURRENCY_MEAN) or 0.0)
            for uuid, row in measured.iterrows()}
    return str(min(keys, key=keys.__getitem__))


def diagnose(run_uuid: str, row: pd.Series, baseline: pd.Series | None, limit: str | None = None) -> Verdict:
    figures = run_figures(row, baseline)
    rule = next(rule for rule in RULES if rule.holds(figures))
    cited = {name: figures[name] for name in rule.cites if _present(figures, name)}
    notes = []
    if rule.bound_by == SERVER_FAILED:  # which failures, by class (the client's own cancellations aside)
        notes = [_shown(name, figures[name]) for name in sorted(figures) if name.startswith("errors_")
                 and name != Output.ERRORS_CANCELLED and (_num(figures, name) or 0) > 0]
    if rule.bound_by == CLIENT and not _present(figures, Output.VALID):
        notes.append("summary missing: the run recorded no figures")
    if rule.bound_by == COMPUTE and baseline is not None:
        where = f"{limit}={baseline.get(limit)}" if limit else "its lowest load"
        notes.append(f"baseline run {baseline.name} ({where})")
    if rule.bound_by == NO_LIMIT and figures.get(Output.PER_TOKEN_LATENCY_PACED) is False:
        notes.append("tpot_ms_p50 is not a per-token figure: the server delivered tokens in bursts")
    return Verdict(run_uuid=run_uuid, bound_by=rule.bound_by, figures=cited, threshold=rule.threshold, notes=notes)


def run_figures(row: pd.Series, baseline: pd.Series | None) -> dict[str, Any]:
    """The row's figures as plain values, with what the rules derive: padded live KV, usable KV, growth."""
    figures: dict[str, Any] = {str(name): _plain(value) for name, value in row.items()}
    figures.update(live_kv_figures(figures))
    if baseline is not None and baseline.name != row.name:
        for name in LATENCY_FIGURES:
            value, base = _num(figures, name), _num(baseline, name)
            per_token = name != Output.TPOT_MS_P50 or (row.get(Output.PER_TOKEN_LATENCY_PACED) is not False
                                                  and baseline.get(Output.PER_TOKEN_LATENCY_PACED) is not False)
            if value is not None and base and per_token:
                figures[GROWTH[name]] = value / base
    return figures


def live_kv_figures(f: Figures) -> dict[str, float]:
    """What the cache must hold at once and what it can: sequences the engine may run together ×
    each one's prompt + output, in whole blocks; and the logged blocks less vLLM's reserved null block.

    Requests beyond max_num_seqs wait without holding KV blocks, so they cannot make the cache the limit.
    """
    derived: dict[str, float] = {}
    blocks, tokens = _num(f, Output.NUM_BLOCKS_LOGGED), _num(f, Output.KV_CACHE_TOKENS_LOGGED)
    block_size = _num(f, Input.BLOCK_SIZE) or (tokens / blocks if blocks and tokens else None)
    if blocks and block_size:
        derived[Derived.KV_CACHE_TOKENS_USABLE] = (blocks - 1) * block_size
    in_flight = (_num(f, Input.CONCURRENCY) or _num(f, Input.MAX_CONCURRENCY)
                 or _num(f, Output.ACHIEVED_CONCURRENCY_MEAN))
    max_num_seqs = _num(f, Input.MAX_NUM_SEQS)
    if in_flight and max_num_seqs:
        in_flight = min(in_flight, max_num_seqs)
    per_s = _num(f, Output.REQUESTS_PER_S)
    prompt_per_s, output_per_s = _num(f, Output.PROMPT_TOKENS_PER_S), _num(f, Output.OUTPUT_TOKENS_PER_S)
    if in_flight and per_s and prompt_per_s is not None and output_per_s is not None:
        per_sequence = (prompt_per_s + output_per_s) / per_s
        if block_size:
            per_sequence = math.ceil(round(per_sequence, 6) / block_size) * block_size
        derived[Derived.KV_TOKENS_NEEDED_PADDED] = in_flight * per_sequence
    return derived


def _at_least(f: Figures, name: str, threshold: float) -> bool:
    value = _num(f, name)
    return value is not None and value >= threshold


def _shown(name: str, value: Any) -> str:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        return f"{name}={int(number)}" if number.is_integer() else f"{name}={number:.4g}"
    return f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"


def _plain(value: Any) -> Any:
    """numpy scalars from a table become Python's, NaN becomes None."""
    if isinstance(value, np.generic):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def _present(f: Figures, name: str) -> bool:
    value = _plain(f.get(name))
    return value is not None and value != ""


def _num(f: Figures | pd.Series, name: str) -> float | None:
    value = _plain(f.get(name))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def _flag(f: Figures | pd.Series, name: str) -> bool | None:
    """Booleans come back as numpy's from a table and as Python's from a dict."""
    value = _plain(f.get(name))
    return value if isinstance(value, bool) else None
