"""Pure statistics over request records and server samples: the run's summary and its validity.

Latencies are measured from the *scheduled* send time, so a client that queued a request (for a free
slot or because it fell behind) shows that wait in TTFT and E2E instead of hiding it. A closed loop has
no schedule: its next request is due when its turn to send comes (`StreamingClient.send`).

A run is invalid when the client did not measure the server: it fell behind its schedule, sent late,
its event loop stalled, or its sampler missed its ticks. A server that delivered tokens in bursts is
a finding about the server, not a failed measurement: the run stays valid and its per-token figures
are qualified (`per_token_latency_paced`). So are its latency tails when the harness's own /metrics
scrapes held the server for a noticeable share of the run (`scrape_share`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import numpy as np

from harness.measure.client import RequestRecord
from harness.measure.engine_time import engine_time
from harness.measure.figures import (
    LATENCIES,
    PERCENTILES,
    ClientHealth,
    RunSummary,
    ScrapeCost,
    ServerFigures,
    StreamPacing,
    latency_names,
)
from harness.measure.loop_lag import PROBE_INTERVAL_S
from harness.measure.record import DEFAULT_MAX_ERROR_FRACTION, ServerSample, Slo
from harness.measure.stream_pacing import PACED_BURST_FRACTION_MAX, SILENCE_GAP_FACTOR, SILENCE_S_MIN, run_pacing

# While the client's loop is late, every chunk it stamps is late by as much: a late stamp, not a slow
# server. Lateness up to a scheduler time slice or two is ordinary jitter on a shared machine; beyond it,
# the loop is stalled. A run whose loop was stalled for more than a twentieth of its time measured the
# client as much as the server.
LOOP_LAG_FLOOR_MS = 10.0
MAX_LOOP_STALL_SHARE = 0.05
# A share needs a run long against one stall. On a shared machine one scheduling hiccup leaves the loop up to
# ~40 ms late, a twentieth of a sub-second run on its own, and it moves only the stamps that fell in it, by no
# more than its length. So the loop must also be stalled for more than 50 ms in all (five jitter floors, more
# than any one hiccup), and a run probed for 1 s or more is judged on its share alone. Measured
# (benchmarks/loop_stalls.py, 2 shared cores, 20 runs of 0.4 s each): latest tick 40.6 ms with no busy loop
# of its own; beside one busy loop per core, up to 34 ms stalled, 5 runs past 5 % and none past 50 ms; beside
# three per core, 57-138 ms stalled in every run, each past both.
MIN_LOOP_STALLED_MS = 50.0
# Send delay is in every TTFT the client reports (it is measured from the schedule): above a twentieth of
# the median TTFT, or the dispatch-lag limit when that is larger, the client's own delay shows in it.
MAX_SEND_DELAY_SHARE_OF_TTFT = 0.05
# vLLM's API server renders /metrics on its event loop, ~10 ms on the CPU engine here, and no stream gets a
# token meanwhile. A p99 is the slowest hundredth: once scrapes hold the server for more than a hundredth of
# the run, the tails can be made of them. Measured: scraped every 1 s (1 % of the run), ITL p99 read 4-18 %
# higher than with no scrapes in each of three paired runs; every 0.25 s (4 %), 34 % above every 1 s. Against
# vllm bench serve (benchmarks/agreement.py), ITL p99 sat 13 % above its figure at 1 s, 6 % below with none.
MAX_SCRAPE_SHARE = 0.01


def max_sample_gap_s(interval_s: float) -> float:
    """A sampler this far behind its ticks saw too little of the run to back its series."""
    return max(3 * interval_s, interval_s + 1.0)


def distribution(name: str, values_ms: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99 and max of one latency, keyed `<name>_ms_<stat>`; None when empty."""
    keys = latency_names(name)
    if len(values_ms) == 0:
        return dict.fromkeys(keys)
    array = np.asarray(values_ms, dtype=float)
    figures = [array.mean(), *np.percentile(array, PERCENTILES), array.max()]
    return {key: float(value) for key, value in zip(keys, figures, strict=True)}


def ttft_ms(record: RequestRecord) -> float:
    assert record.first_token_s is not None
    return (record.first_token_s - record.scheduled_s) * 1000


def dispatch_lag_ms(record: RequestRecord) -> float:
    """How late the client sent the request: after its scheduled time, or after the moment a capped open loop's
    slot came free for it, whichever was later (the cap's wait is the load's, not the client's)."""
    due_s = max(record.scheduled_s, record.slot_freed_s) if record.slot_freed_s is not None else record.scheduled_s
    return (record.dispatch_s - due_s) * 1000


def tpot_ms(record: RequestRecord) -> float | None:
    """Decode time per output token after the first; None with fewer than two tokens."""
    tokens = sum(record.chunk_tokens)
    if tokens < 2:
        return None
    return (record.chunk_times_s[-1] - record.chunk_times_s[0]) * 1000 / (tokens - 1)


def itl_ms(record: RequestRecord) -> list[float]:
    """Per-token gaps: a chunk carrying k tokens after a gap g contributes k gaps of g/k."""
    gaps: list[float] = []
    times, tokens = record.chunk_times_s, record.chunk_tokens
    for i in range(1, len(times)):
        gaps.extend([(times[i] - times[i - 1]) * 1000 / tokens[i]] * tokens[i])
    return gaps


def meets_slo(record: RequestRecord, slo: Slo) -> bool:
    if slo.ttft_ms is not None and ttft_ms(record) > slo.ttft_ms:
        return False
    tpot = tpot_ms(record)
    return slo.tpot_ms is None or tpot is None or tpot <= slo.tpot_ms


def server_figures(samples: Sequence[ServerSample]) -> ServerFigures:
    """Peaks of gauges and growth of counters between the first and last successful scrape."""
    snapshots = [sample.snapshot for sample in samples if sample.snapshot is not None]

    def peak(values: list[float | None]) -> float | None:
        return max((value for value in values if value is not None), default=None)

    def growth(values: list[int | None]) -> int | None:
        present = [value for value in values if value is not None]
        return present[-1] - present[0] if present else None

    waiting = [s.num_requests_waiting for s in snapshots]
    return ServerFigures(
        peak_waiting_requests=max((value for value in waiting if value is not None), default=None),
        peak_kv_cache_usage_fraction=peak([s.kv_cache_usage_fraction for s in snapshots]),
        preemptions_during_run=growth([s.num_preemptions_total for s in snapshots]),
        prefix_cache_hits_during_run_tokens=growth([s.prefix_cache_hits_total for s in snapshots]),
    )


def summarize(
    records: Sequence[RequestRecord],
    samples: Sequence[ServerSample],
    *,
    slo: Slo,
    offered_requests_per_s: float | None,
    offered_concurrency: int | None,
    cold: bool,
    max_dispatch_lag_ms: float,
    sample_interval_s: float | None = None,
    loop_lags_ms: Sequence[float] = (),
    prompt_token_mismatches: int = 0,
    interrupted_by: str | None = None,
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION,
) -> RunSummary:
    measured = [record for record in records if not record.warmup]
    ok = [record for record in measured if record.error_class is None and record.first_token_s is not None]
    window_s = (
        max(record.end_s for record in measured) - min(record.scheduled_s for record in measured)
        if measured
        else 0.0
    )
    per_s = (lambda count: count / window_s) if window_s > 0 else (lambda count: 0.0)
    dispatches = sorted(record.dispatch_s for record in measured)
    dispatch_span_s = dispatches[-1] - dispatches[0] if len(dispatches) > 1 else 0.0

    latencies_ms = {
        "ttft": [ttft_ms(r) for r in ok],
        "tpot": [t for r in ok if (t := tpot_ms(r)) is not None],
        "itl": [gap for r in ok for gap in itl_ms(r)],
        "e2e": [(r.end_s - r.scheduled_s) * 1000 for r in ok],
        "dispatch_lag": [dispatch_lag_ms(r) for r in measured],
        "send_delay": [(r.sent_s - r.dispatch_s) * 1000 for r in measured if r.sent_s is not None],
    }
    latency = {key: value for name in LATENCIES for key, value in distribution(name, latencies_ms[name]).items()}
    server = server_figures(samples)
    health = client_health(samples, loop_lags_ms)
    errors = dict(Counter(str(r.error_class) for r in measured if r.error_class is not None))
    error_rate = error_rate_fraction(errors, len(measured))
    reasons = validity_problems(latency, server, health, ok, cold=cold, max_dispatch_lag_ms=max_dispatch_lag_ms,
                                sample_interval_s=sample_interval_s, error_rate=error_rate,
                                max_error_fraction=max_error_fraction, errors=errors,
                                probed_ms=loop_probed_ms(loop_lags_ms))
    if interrupted_by is not None:
        reasons.append(f"run stopped early by {interrupted_by}")
    has_slo = slo.ttft_ms is not None or slo.tpot_ms is not None
    attainment = sum(meets_slo(r, slo) for r in ok) / len(measured) if has_slo and measured else None
    pacing = run_pacing(ok)
    scrape = scrape_cost(samples)
    return RunSummary(
        requests_sent=len(records),
        requests_measured=len(measured),
        requests_ok=len(ok),
        errors_by_class=errors,
        error_fraction_by_class={name: count / len(measured) for name, count in errors.items()},
        error_rate_fraction=error_rate,
        max_error_fraction=max_error_fraction,
        window_s=window_s,
        latency=latency,
        requests_per_s=per_s(len(ok)),
        output_tokens_per_s=per_s(sum(sum(r.chunk_tokens) for r in ok)),
        prompt_tokens_per_s=per_s(sum(r.prompt_tokens or 0 for r in ok)),
        chunks_per_s=per_s(sum(len(r.chunk_times_s) for r in ok)),
        goodput_requests_per_s=per_s(sum(meets_slo(r, slo) for r in ok)) if has_slo else None,
        slo_attainment_share=attainment,
        slo_met=None if attainment is None or slo.target_share is None else int(attainment >= slo.target_share),
        offered_requests_per_s=offered_requests_per_s,
        achieved_dispatch_per_s=(len(dispatches) - 1) / dispatch_span_s if dispatch_span_s > 0 else 0.0,
        offered_concurrency=offered_concurrency,
        achieved_concurrency_mean=per_s(sum(r.end_s - r.dispatch_s for r in measured)),
        failed_scrapes=sum(sample.snapshot is None for sample in samples),
        sample_interval_s=sample_interval_s,
        prompt_token_mismatches=prompt_token_mismatches,
        valid=not reasons,
        invalid_reasons=reasons,
        qualifications=qualifications(pacing, scrape, sample_interval_s),
        stopped_by_signal=interrupted_by,
        health=health,
        scrape=scrape,
        pacing=pacing,
        engine=engine_time(records, samples),
        server=server,
    )


def qualifications(pacing: StreamPacing, scrape: ScrapeCost, sample_interval_s: float | None) -> list[str]:
    found = []
    fraction = pacing.burst_token_fraction
    if pacing.per_token_latency_paced is False:
        found.append(f"tpot_ms and itl_ms are not per-token figures: the server delivered tokens in bursts "
                     f"(burst_token_fraction {fraction:.2f} > {PACED_BURST_FRACTION_MAX:g}, largest_burst_tokens "
                     f"{pacing.largest_burst_tokens}); engine_itl_ms_mean is the engine's own")
    if pacing.server_went_silent:
        found.append(f"latencies include a stop of the server: no token reached any stream for "
                     f"{pacing.stream_silence_s_max:.2f} s from {pacing.stream_silence_at_s:.1f} s while streams "
                     f"were open (stream_silence_s_max; more than {SILENCE_GAP_FACTOR:g} × the run's median token gap "
                     f"and {SILENCE_S_MIN:g} s)")
    share = scrape.scrape_share
    if share is not None and share > MAX_SCRAPE_SHARE:
        every = f" every {sample_interval_s:g} s" if sample_interval_s is not None else ""
        found.append(f"latency tails include this run's own /metrics scrapes: scrape_share {share:.3f} > "
                     f"{MAX_SCRAPE_SHARE:g} (scrape_ms_mean {scrape.scrape_ms_mean:.1f}{every}); a longer "
                     f"--sample-interval-s scrapes less")
    return found


def scrape_cost(samples: Sequence[ServerSample]) -> ScrapeCost:
    """How long the server spent answering this run's scrapes: their mean, and their share of the time
    from the first scrape to the end of the last (an upper bound: it includes the network and the wait
    for the server's event loop)."""
    timed = [(sample.t_s, sample.duration_s) for sample in samples if sample.duration_s is not None]
    if len(timed) < 2:
        return ScrapeCost()
    busy_s = sum(duration_s for _, duration_s in timed)
    span_s = timed[-1][0] + timed[-1][1] - timed[0][0]
    return ScrapeCost(scrape_ms_mean=1000 * busy_s / len(timed), scrape_share=busy_s / span_s)


def client_health(
    samples: Sequence[ServerSample], loop_lags_ms: Sequence[float], probe_interval_s: float = PROBE_INTERVAL_S
) -> ClientHealth:
    """The client's own lateness: its event loop's, and its sampler's against the configured interval.

    One tick of the loop probe reports one lateness however long the stall, so the share of the probe's
    time spent stalled (beyond the jitter floor) is what weighs a stall by its length."""
    times = [sample.t_s for sample in samples]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    lags = np.asarray(loop_lags_ms, dtype=float)
    probed_ms = loop_probed_ms(loop_lags_ms, probe_interval_s)
    return ClientHealth(
        sample_gap_s_max=max(gaps) if gaps else None,
        loop_lag_ms_p99=float(np.percentile(lags, 99)) if lags.size else None,
        loop_lag_ms_max=float(lags.max()) if lags.size else None,
        loop_stall_share=float(np.clip(lags - LOOP_LAG_FLOOR_MS, 0, None).sum() / probed_ms) if lags.size else None,
    )


def loop_probed_ms(loop_lags_ms: Sequence[float], probe_interval_s: float = PROBE_INTERVAL_S) -> float:
    """How long the loop probe ran: each tick's interval plus how late it fired."""
    return len(loop_lags_ms) * probe_interval_s * 1000 + float(sum(loop_lags_ms))


def max_loop_stall_share(probed_ms: float) -> float:
    """The stalled share past which the client measured itself: a twentieth of the probed time, or 50 ms of it
    where that is more, so that one hiccup cannot make a short run invalid (see MIN_LOOP_STALLED_MS)."""
    return max(MAX_LOOP_STALL_SHARE, MIN_LOOP_STALLED_MS / probed_ms) if probed_ms > 0 else MAX_LOOP_STALL_SHARE


def validity_problems(
    latency: dict[str, float | None],
    server: ServerFigures,
    health: ClientHealth,
    ok: Sequence[RequestRecord],
    *,
    cold: bool,
    max_dispatch_lag_ms: float,
    sample_interval_s: float | None,
    error_rate: float = 0.0,
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION,
    errors: dict[str, int] | None = None,
    probed_ms: float = 0.0,
) -> list[str]:
    """Why the run does not measure what it claims: requests failed, the client fell behind, sent late,
    stalled or sampled too rarely, or a cold run hit the cache. Each reason names its figure and threshold."""
    reasons = []
    if not ok:
        reasons.append("no measured request succeeded")
    reasons += error_rate_problems(error_rate, max_error_fraction, errors or {})
    lag = latency["dispatch_lag_ms_p99"]
    if lag is not None and lag > max_dispatch_lag_ms:
        reasons.append(f"client fell behind its schedule: dispatch_lag_ms_p99 {lag:.1f} > {max_dispatch_lag_ms:g}")
    send_delay, ttft = latency["send_delay_ms_p99"], latency["ttft_ms_p50"]
    send_limit = max(max_dispatch_lag_ms, MAX_SEND_DELAY_SHARE_OF_TTFT * (ttft or 0.0))
    if send_delay is not None and send_delay > send_limit:
        reasons.append(f"client sent late: send_delay_ms_p99 {send_delay:.1f} > {send_limit:.1f} "
                       f"(the larger of {max_dispatch_lag_ms:g} and {MAX_SEND_DELAY_SHARE_OF_TTFT:g} x ttft_ms_p50)")
    stalled, stall_limit = health.loop_stall_share, max_loop_stall_share(probed_ms)
    if stalled is not None and stalled > stall_limit:
        reasons.append(f"client event loop stalled: loop_stall_share {stalled:.3f} > {stall_limit:.3f} (the larger "
                       f"of {MAX_LOOP_STALL_SHARE:g} and {MIN_LOOP_STALLED_MS:g} ms of {probed_ms:.0f} ms probed; "
                       f"loop_lag_ms_max {health.loop_lag_ms_max:.0f})")
    gap = health.sample_gap_s_max
    if gap is not None and sample_interval_s is not None and gap > max_sample_gap_s(sample_interval_s):
        reasons.append(f"sampler missed its ticks: sample_gap_s_max {gap:.2f} > "
                       f"{max_sample_gap_s(sample_interval_s):.2f} (interval {sample_interval_s:g} s)")
    hits = server.prefix_cache_hits_during_run_tokens
    if cold and hits:
        reasons.append(f"run declared cold but the prefix cache hit {hits} tokens")
    return reasons


def error_rate_fraction(errors: dict[str, int], measured: int) -> float:
    """Failed measured requests over all measured ones; requests the client itself cancelled (a stopped run)
    are not the server's failures and do not count."""
    failed = sum(count for name, count in errors.items() if name != "cancelled")
    return failed / measured if measured else 0.0


def error_rate_problems(error_rate: float, max_error_fraction: float, errors: dict[str, int]) -> list[str]:
    """A run with too many failed requests measured a failing server; the reason names each class."""
    if error_rate <= max_error_fraction:
        return []
    by_class = ", ".join(f"{name} {count}" for name, count in sorted(errors.items()) if name != "cancelled")
    return [f"requests failed: error_rate_fraction {error_rate:.3f} > {max_error_fraction:g} ({by_class})"]
