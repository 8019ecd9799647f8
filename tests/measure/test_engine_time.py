"""Where requests spent their time, from histogram growth on hand-built scrapes; numbers worked out below."""

from __future__ import annotations

import pytest

from harness.measure.engine_time import engine_time
from harness.measure.record import ServerSample
from harness.observe.server_metrics import Histogram, MetricsSnapshot

from test_stats import record


def totals(sum_s: float, count: float) -> Histogram:
    return Histogram(buckets=[], sum=sum_s, count=count)


def scrape(t_s: float, *, queue: float, prefill: float, decode: float, e2e: float, count: float) -> ServerSample:
    return ServerSample(t_s=t_s, snapshot=MetricsSnapshot(
        request_queue_time_seconds=totals(queue, count), request_prefill_time_seconds=totals(prefill, count),
        request_decode_time_seconds=totals(decode, count), e2e_request_latency_seconds=totals(e2e, count)))


# Before the load the engine had served 10 requests (their sums must not count); during it, 2 more:
# queue 0.4 s, prefill 0.2 s, decode 1.0 s, engine end-to-end 1.7 s in all.
BEFORE = scrape(0.0, queue=5.0, prefill=1.0, decode=4.0, e2e=11.0, count=10)
AFTER = scrape(2.5, queue=5.4, prefill=1.2, decode=5.0, e2e=12.7, count=12)
# The client: both sent at 0.0 s, first ends at 1.0 s, second at 2.0 s -> e2e mean 1.5 s, window 2.0 s.
RECORDS = [record(1, 0.0, 0.0, [(0.5, 1), (0.9, 1)], 1.0), record(2, 0.0, 0.0, [(0.6, 1), (1.9, 1)], 2.0)]


def test_means_come_from_what_the_run_added_to_the_histograms() -> None:
    figures = engine_time(RECORDS, [BEFORE, AFTER])
    assert figures["engine_requests_finished"] == 2
    assert figures["engine_queue_ms_mean"] == pytest.approx(200.0)  # 0.4 s / 2
    assert figures["engine_prefill_ms_mean"] == pytest.approx(100.0)  # 0.2 s / 2
    assert figures["engine_decode_ms_mean"] == pytest.approx(500.0)  # 1.0 s / 2
    assert figures["engine_e2e_ms_mean"] == pytest.approx(850.0)  # 1.7 s / 2
    assert figures["engine_ttft_ms_mean"] is None  # not exported in these scrapes


def test_littles_law_and_the_front_end_remainder() -> None:
    figures = engine_time(RECORDS, [BEFORE, AFTER])
    assert figures["engine_waiting_requests_mean"] == pytest.approx(0.4 / 2.0)  # queue seconds over the window
    assert figures["engine_running_requests_mean"] == pytest.approx((0.2 + 1.0) / 2.0)
    # client e2e mean 1,500 ms; engine queue + prefill + decode 200 + 100 + 500 = 800 ms; front end 700 ms
    assert figures["client_e2e_ms_mean"] == pytest.approx(1500.0)
    assert figures["frontend_ms_mean"] == pytest.approx(700.0)
    assert figures["frontend_share"] == pytest.approx(700 / 1500)


def test_nothing_without_two_scrapes() -> None:
    assert set(engine_time(RECORDS, [AFTER]).values()) == {None}
