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
ENGINE_FIGURES = (*(f"{span}_ms_mean" for span in ENGINE_SPANS), "engine_requests_finished",
                  "engine_waiting_requests_mean", "engine_running_requests_mean", "client_e2e_ms_mean",
                  "frontend_ms_mean", "frontend_share")


def engine_time(records: Sequence[RequestRecord], samples: Sequence[ServerSample]) -> dict[str, float | int | None]:
    """`records`: every request the run sent (warm-up included: the engine's histograms count them too)."""
    figures: dict[str, float | int | None] = dict.fromkeys(ENGINE_FIGURES)
    snapshots = [sample.snapshot for sample in samples if sample.snapshot is not None]
    if len(snapshots) < 2:
        return figures
    first, last = snapshots[0], snapshots[-1]
    grown = {span: _growth(first, last, field) for span, field in ENGINE_SPANS.items()}
    for span, growth in grown.items():
        if growth is not None and growth[1] > 0:
            figures[f"{span}_ms_mean"] = growth[0] * 1000 / growth[1]
    if grown["engine_e2e"] is not None:
        figures["engine_requests_finished"] = round(grown["engine_e2e"][1])

    ok = [r for r in records if r.error_class is None and r.first_token_s is not None]
    if not ok:
        return figures
    window_s = max(r.end_s for r in ok) - min(r.dispatch_s for r in ok)
    queue, prefill, decode = grown["engine_queue"], grown["engine_prefill"], grown["engine_decode"]
    if window_s > 0 and queue is not None:
        figures["engine_waiting_requests_mean"] = queue[0] / window_s
    if window_s > 0 and prefill is not None and decode is not None:
        figures["engine_running_requests_mean"] = (prefill[0] + decode[0]) / window_s
    client_e2e_ms = sum((r.end_s - (r.sent_s if r.sent_s is not None else r.dispatch_s)) * 1000 for r in ok) / len(ok)
    figures["client_e2e_ms_mean"] = client_e2e_ms
    spans = [figures[f"{span}_ms_mean"] for span in ("engine_queue", "engine_prefill", "engine_decode")]
    if all(span is not None for span in spans) and client_e2e_ms > 0:
        frontend_ms = client_e2e_ms - sum(span for span in spans if span is not None)
        figures["frontend_ms_mean"] = frontend_ms
        figures["frontend_share"] = frontend_ms / client_e2e_ms
    return figures


def _growth(first: MetricsSnapshot, last: MetricsSnapshot, field: str) -> tuple[float, float] | None:
    """(sum, count) the run added to one histogram; None when the server does not export it."""
    before: Histogram | None = getattr(first, field)
    after: Histogram | None = getattr(last, field)
    if after is None:
        return None
    if before is None:
        return after.sum, after.count
    return after.sum - before.sum, after.count - before.count
