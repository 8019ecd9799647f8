"""Where a run's requests spent their time, from vLLM's own histograms, beside what the client saw.

The engine core stamps each request when it is queued, scheduled, produces its first token and its
last; vLLM exports those spans as histograms (queue, prefill, decode, TTFT, inter-token, end-to-end).
Their sum and count grow by exactly what the run added between the scrape before the load and the
scrape after it, so the means below need no lucky sample, and no client or front-end delay can
inflate them. Little's law turns the same sums into how many requests waited and ran on average.

What the client saw end to end minus the engine's queue + prefill + decode is the *front end*: the API
server taking the request in and streaming it out, HTTP, and the client itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.measure.client import RequestRecord
from harness.measure.figures import EngineTime
from harness.measure.record import ServerSample
from harness.observe.server_metrics import Histogram, MetricsSnapshot

# figure prefix → snapshot field
ENGINE_SPANS = {
    "engine_queue": "request_queue_time_seconds",
    "engine_prefill": "request_prefill_time_seconds",
    "engine_decode": "request_decode_time_seconds",
    "engine_ttft": "time_to_first_token_seconds",
    "engine_itl": "inter_token_latency_seconds",
    "engine_e2e": "e2e_request_latency_seconds",
}


def engine_time(records: Sequence[RequestRecord], samples: Sequence[ServerSample]) -> EngineTime:
    """`records`: every request the run sent (warm-up included: the engine's histograms count them too)."""
    snapshots = [sample.snapshot for sample in samples if sample.snapshot is not None]
    if len(snapshots) < 2:
        return EngineTime()
    first, last = snapshots[0], snapshots[-1]
    grown = {span: _growth(first, last, field) for span, field in ENGINE_SPANS.items()}
    means = {span: growth[0] * 1000 / growth[1] if growth is not None and growth[1] > 0 else None
             for span, growth in grown.items()}
    finished = grown["engine_e2e"]
    ok = [r for r in records if r.error_class is None and r.first_token_s is not None]
    window_s = max(r.end_s for r in ok) - min(r.dispatch_s for r in ok) if ok else 0.0
    queue, prefill, decode = grown["engine_queue"], grown["engine_prefill"], grown["engine_decode"]
    client_e2e_ms = (sum((r.end_s - (r.sent_s if r.sent_s is not None else r.dispatch_s)) * 1000 for r in ok)
                     / len(ok) if ok else None)
    frontend_ms = _frontend_ms(client_e2e_ms, [means["engine_queue"], means["engine_prefill"], means["engine_decode"]])
    return EngineTime(
        engine_queue_ms_mean=means["engine_queue"],
        engine_prefill_ms_mean=means["engine_prefill"],
        engine_decode_ms_mean=means["engine_decode"],
        engine_ttft_ms_mean=means["engine_ttft"],
        engine_itl_ms_mean=means["engine_itl"],
        engine_e2e_ms_mean=means["engine_e2e"],
        engine_requests_finished=None if finished is None else round(finished[1]),
        engine_waiting_requests_mean=queue[0] / window_s if window_s > 0 and queue is not None else None,
        engine_running_requests_mean=(prefill[0] + decode[0]) / window_s
        if window_s > 0 and prefill is not None and decode is not None else None,
        client_e2e_ms_mean=client_e2e_ms,
        frontend_ms_mean=frontend_ms,
        frontend_share=None if frontend_ms is None or not client_e2e_ms else frontend_ms / client_e2e_ms,
    )


def _frontend_ms(client_e2e_ms: float | None, engine_spans_ms: list[float | None]) -> float | None:
    """The client's end-to-end time outside the engine's queue, prefill and decode; None without all three."""
    if client_e2e_ms is None or client_e2e_ms <= 0 or any(span is None for span in engine_spans_ms):
        return None
    return client_e2e_ms - sum(span for span in engine_spans_ms if span is not None)


def _growth(first: MetricsSnapshot, last: MetricsSnapshot, field: str) -> tuple[float, float] | None:
    """(sum, count) the run added to one histogram; None when the server does not export it."""
    before: Histogram | None = getattr(first, field)
    after: Histogram | None = getattr(last, field)
    if after is None:
        return None
    if before is None:
        return after.sum, after.count
    return after.sum - before.sum, after.count - before.count
