"""Summary statistics on hand-built records; every expected figure is worked out in the comments."""

from __future__ import annotations

from typing import Any

import pytest

from harness.measure.client import ErrorClass, RequestRecord
from harness.measure.record import ServerSample, Slo
from harness.measure.stats import (
    RunSummary,
    dispatch_lag_ms,
    distribution,
    itl_ms,
    max_loop_stall_share,
    summarize,
    tpot_ms,
)
from harness.observe.server_metrics import MetricsSnapshot


def record(index: int, scheduled_s: float, dispatch_s: float, chunks: list[tuple[float, int]], end_s: float,
           *, warmup: bool = False, error: ErrorClass | None = None) -> RequestRecord:
    return RequestRecord(
        index=index,
        prompt_id=f"p{index}",
        warmup=warmup,
        max_tokens=8,
        scheduled_s=scheduled_s,
        dispatch_s=dispatch_s,
        first_token_s=chunks[0][0] if chunks else None,
        end_s=end_s,
        chunk_times_s=[t for t, _ in chunks],
        chunk_tokens=[n for _, n in chunks],
        prompt_tokens=16 if not error else None,
        output_tokens=sum(n for _, n in chunks) if not error else None,
        finish_reason="length" if not error else None,
        http_status=200,
        error_class=error,
    )


# r1: on time; first token at 100 ms; then chunks of 1 and 2 tokens -> TTFT 100, TPOT 30/3 = 10,
#     ITL 10 | 10, 10 (a 20 ms gap carrying 2 tokens is two 10 ms gaps), E2E 135.
R1 = record(1, 0.0, 0.0, [(0.100, 1), (0.110, 1), (0.130, 2)], 0.135)
# r2: scheduled at 1.0 s but dispatched 50 ms late -> TTFT 250 from the schedule, TPOT 20, ITL 20, E2E 280.
R2 = record(2, 1.0, 1.050, [(1.250, 1), (1.270, 1)], 1.280)
WARMUP = record(0, -1.0, -1.0, [(-0.5, 1), (-0.4, 1)], -0.3, warmup=True)
TIMED_OUT = record(3, 0.5, 0.5, [], 0.9, error=ErrorClass.timeout)


def snapshot(waiting: int, kv: float, preemptions: int, hits: int) -> MetricsSnapshot:
    return MetricsSnapshot(
        num_requests_waiting=waiting,
        kv_cache_usage_fraction=kv,
        num_preemptions_total=preemptions,
        prefix_cache_hits_total=hits,
    )


SAMPLES = [
    ServerSample(t_s=0.0, snapshot=snapshot(0, 0.1, 2, 10)),
    ServerSample(t_s=0.5, error="ReadTimeout: timed out"),
    ServerSample(t_s=1.0, snapshot=snapshot(3, 0.7, 2, 10)),
    ServerSample(t_s=1.5, snapshot=snapshot(1, 0.2, 5, 14)),
]


def summary(**overrides: Any) -> RunSummary:
    arguments: dict[str, Any] = dict(
        slo=Slo(ttft_ms=200.0),
        offered_requests_per_s=2.0,
        offered_concurrency=None,
        cold=True,
        max_dispatch_lag_ms=10.0,
    )
    return summarize([WARMUP, R1, TIMED_OUT, R2], SAMPLES, **(arguments | overrides))


def test_per_request_figures_count_every_token_of_a_multi_token_chunk() -> None:
    assert tpot_ms(R1) == pytest.approx(10.0)
    assert itl_ms(R1) == pytest.approx([10.0, 10.0, 10.0])
    assert tpot_ms(record(9, 0, 0, [(0.1, 1)], 0.1)) is None


def test_latencies_are_measured_from_the_schedule_over_successful_measured_requests() -> None:
    latency = summary().latency
    # TTFT [100, 250]: mean 175, p99 by linear interpolation 100 + 0.99 * 150 = 248.5.
    assert latency["ttft_ms_mean"] == pytest.approx(175.0)
    assert latency["ttft_ms_p99"] == pytest.approx(248.5)
    assert latency["ttft_ms_max"] == pytest.approx(250.0)
    # ITL [10, 10, 10, 20]: mean 12.5, median 10.
    assert latency["itl_ms_mean"] == pytest.approx(12.5)
    assert latency["itl_ms_p50"] == pytest.approx(10.0)
    assert latency["e2e_ms_max"] == pytest.approx(280.0)
    assert latency["tpot_ms_mean"] == pytest.approx(15.0)


def test_throughput_goodput_errors_and_achieved_load() -> None:
    result = summary()
    # Window: first measured schedule 0.0 s to last measured end 1.28 s.
    assert result.window_s == pytest.approx(1.28)
    assert result.requests_measured == 3 and result.requests_ok == 2 and result.requests_sent == 4
    assert result.requests_per_s == pytest.approx(2 / 1.28)
    assert result.output_tokens_per_s == pytest.approx(6 / 1.28)
    assert result.goodput_requests_per_s == pytest.approx(1 / 1.28)  # only r1 has TTFT <= 200 ms
    assert result.errors_by_class == {"timeout": 1}
    # Busy time 0.135 + 0.230 + 0.400 s over 1.28 s.
    assert result.achieved_concurrency_mean == pytest.approx(0.765 / 1.28)
    # Dispatches at 0.0, 0.5, 1.05 s: 2 intervals over 1.05 s.
    assert result.achieved_dispatch_per_s == pytest.approx(2 / 1.05)


def test_the_objective_is_met_when_the_target_share_of_measured_requests_meets_the_limits() -> None:
    # Measured: r1 (TTFT 100 ms), r2 (TTFT 250 ms) and one timed out; a failed request meets nothing.
    assert summary(slo=Slo(ttft_ms=200.0)).slo_attainment_share == pytest.approx(1 / 3)  # r1 alone
    assert summary(slo=Slo(ttft_ms=200.0)).slo_met is None  # no target share: nothing to meet
    assert summary(slo=Slo(ttft_ms=200.0, target_share=0.3)).slo_met == 1  # 1/3 >= 0.3
    assert summary(slo=Slo(ttft_ms=300.0, target_share=0.7)).slo_met == 0  # r1 and r2: 2/3 < 0.7
    assert summary(slo=Slo(target_share=0.5)).slo_met is None  # no limit: no objective


def test_server_samples_give_peaks_and_counter_growth_and_count_failed_scrapes() -> None:
    result = summary()
    assert result.server.peak_waiting_requests == 3
    assert result.server.peak_kv_cache_usage_fraction == pytest.approx(0.7)
    assert result.server.preemptions_during_run == 3
    assert result.server.prefix_cache_hits_during_run_tokens == 4
    assert result.failed_scrapes == 1


def test_a_late_client_and_cache_hits_in_a_cold_run_make_the_run_invalid() -> None:
    result = summary()
    assert not result.valid
    # Dispatch lag [0, 50, 0] ms: p99 = 0 + 0.98 * 50 = 49 ms > 10 ms.
    assert result.latency["dispatch_lag_ms_p99"] == pytest.approx(49.0)
    assert any("fell behind" in reason and "49.0" in reason for reason in result.invalid_reasons)
    assert any("cold" in reason for reason in result.invalid_reasons)


def test_a_wait_for_a_capped_loops_slot_is_in_the_latency_not_the_client_lag() -> None:
    # R2 again, but it found every slot taken at 1.0 s and one came free at 1.048 s: it left 2 ms after that,
    # so its dispatch lag is 1.050 - 1.048 = 2 ms, not 50; its TTFT still counts from the schedule: 250 ms.
    held = R2.model_copy(update={"slot_freed_s": 1.048})
    assert dispatch_lag_ms(held) == pytest.approx(2.0) and dispatch_lag_ms(R2) == pytest.approx(50.0)
    result = summarize([WARMUP, R1, TIMED_OUT, held], SAMPLES, slo=Slo(ttft_ms=200.0), offered_requests_per_s=2.0,
                       offered_concurrency=None, cold=False, max_dispatch_lag_ms=10.0, max_error_fraction=0.5)
    # lags [0, 0, 2] ms: p99 = 0 + 0.98 * 2 = 1.96 ms, under 10: the run is valid
    assert result.latency["dispatch_lag_ms_p99"] == pytest.approx(1.96) and result.valid, result.invalid_reasons
    assert result.latency["ttft_ms_max"] == pytest.approx(250.0)


def test_the_same_records_pass_with_tolerant_thresholds_in_a_warm_run() -> None:
    result = summary(cold=False, max_dispatch_lag_ms=60.0, max_error_fraction=0.5)
    assert result.valid and result.invalid_reasons == []
    interrupted = summary(cold=False, max_dispatch_lag_ms=60.0, max_error_fraction=0.5, interrupted_by="SIGTERM")
    assert not interrupted.valid and interrupted.invalid_reasons == ["run stopped early by SIGTERM"]
    assert interrupted.stopped_by_signal == "SIGTERM"


def test_failed_requests_above_the_error_threshold_make_the_run_invalid_by_class() -> None:
    # Measured: R1, TIMED_OUT, R2 (the warm-up is left out): 1 failed of 3 = 0.333 > 0.05 (the default).
    result = summary(cold=False, max_dispatch_lag_ms=60.0)
    assert result.errors_by_class == {"timeout": 1}
    assert result.error_rate_fraction == pytest.approx(1 / 3)
    assert result.error_fraction_by_class == {"timeout": pytest.approx(1 / 3)}
    assert result.invalid_reasons == ["requests failed: error_rate_fraction 0.333 > 0.05 (timeout 1)"]
    # At a 0.34 threshold the same third is tolerated.
    assert summary(cold=False, max_dispatch_lag_ms=60.0, max_error_fraction=0.34).valid


def test_requests_the_client_cancelled_are_not_server_errors() -> None:
    cancelled = record(4, 1.5, 1.5, [], 1.6, error=ErrorClass.cancelled)
    result = summarize([R1, R2, cancelled], SAMPLES, slo=Slo(), offered_requests_per_s=None, offered_concurrency=2,
                       cold=False, max_dispatch_lag_ms=60.0, interrupted_by="SIGINT")
    # 3 measured, 1 cancelled: by class 1/3, but the server failed none of them.
    assert result.error_fraction_by_class == {"cancelled": pytest.approx(1 / 3)}
    assert result.error_rate_fraction == 0.0
    assert result.invalid_reasons == ["run stopped early by SIGINT"]


def test_no_goodput_without_slos_and_no_figures_without_values() -> None:
    assert summary(slo=Slo()).goodput_requests_per_s is None
    assert distribution("ttft", []) == dict.fromkeys(
        ["ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p95", "ttft_ms_p99", "ttft_ms_max"]
    )


def test_a_stalled_loop_and_a_lagging_sampler_make_the_run_invalid() -> None:
    # 200 probe ticks of 5 ms: 199 on time (2 ms late, under the 10 ms jitter floor) and one 300 ms stall.
    # Stalled share: (300 - 10) / (200 x 5 + 199 x 2 + 300) = 290 / 1,698 = 0.171 > 0.05.
    lags = [2.0] * 199 + [300.0]
    result = summary(cold=False, max_dispatch_lag_ms=60.0, loop_lags_ms=lags, sample_interval_s=0.25)
    assert result.health.loop_stall_share == pytest.approx(290 / 1698)
    assert result.health.loop_lag_ms_max == 300.0
    stalled = "client event loop stalled: loop_stall_share 0.171"
    assert any(reason.startswith(stalled) for reason in result.invalid_reasons)
    # The samples are 0.5 s apart; with a 0.25 s interval the allowed gap is max(0.75, 1.25) = 1.25 s: fine.
    assert result.health.sample_gap_s_max == pytest.approx(0.5)
    assert not any("sampler" in reason for reason in result.invalid_reasons)
    # With a 0.1 s interval the allowed gap is max(0.3, 1.1) = 1.1 s: still fine; nothing else is late.
    steady = summary(cold=False, max_dispatch_lag_ms=60.0, loop_lags_ms=[2.0] * 200, sample_interval_s=0.1,
                     max_error_fraction=0.5)  # the one timeout of 3 is allowed here
    assert steady.valid and steady.health.loop_stall_share == 0.0


def test_a_short_run_needs_more_than_one_hiccup_to_count_as_stalled() -> None:
    def judged(lags: list[float]) -> RunSummary:  # nothing else is late; the one timeout of 3 is allowed here
        return summary(cold=False, max_dispatch_lag_ms=60.0, max_error_fraction=0.5, loop_lags_ms=lags)

    # 80 ticks of 5 ms (a 0.4 s run): 79 at 1 ms late and one hiccup 41 ms late, about the latest single tick
    # measured on a shared machine (benchmarks/loop_stalls.py). Stalled 41 - 10 = 31 ms of 80 x 5 + 79 x 1 + 41
    # = 520 ms probed: 31 / 520 = 0.0596, over 0.05 but under max(0.05, 50 / 520) = 0.0962: the run stays valid.
    hiccup = judged([1.0] * 79 + [41.0])
    assert hiccup.health.loop_stall_share == pytest.approx(31 / 520)
    assert hiccup.valid and max_loop_stall_share(520) == pytest.approx(50 / 520)
    # The same run with four ticks 25 ms late: stalled 4 x 15 = 60 ms of 80 x 5 + 76 x 1 + 4 x 25 = 576 ms probed,
    # 60 / 576 = 0.104 > max(0.05, 50 / 576) = 0.087: stalled for longer than any one hiccup, and invalid.
    repeated = judged([1.0] * 76 + [25.0] * 4)
    assert repeated.invalid_reasons == ["client event loop stalled: loop_stall_share 0.104 > 0.087 (the larger of "
                                        "0.05 and 50 ms of 576 ms probed; loop_lag_ms_max 25)"]
    # From 1,000 ms probed the share alone decides: 399 ticks on time and one 120 ms late is 110 ms stalled of
    # 400 x 5 + 120 = 2,120 ms, 110 / 2,120 = 0.0519 > max(0.05, 50 / 2,120 = 0.0236) = 0.05: one stall that long
    # is more than a hiccup, and invalid.
    assert max_loop_stall_share(1000) == max_loop_stall_share(2120) == 0.05
    long_stall = judged([0.0] * 399 + [120.0])
    assert long_stall.invalid_reasons == ["client event loop stalled: loop_stall_share 0.052 > 0.050 (the larger of "
                                          "0.05 and 50 ms of 2120 ms probed; loop_lag_ms_max 120)"]


def test_a_sampler_far_behind_its_interval_makes_the_run_invalid() -> None:
    late = [
        ServerSample(t_s=0.0, snapshot=snapshot(0, 0.1, 0, 0)),
        ServerSample(t_s=2.0, snapshot=snapshot(0, 0.1, 0, 0)),
    ]
    result = summarize([R1], late, slo=Slo(), offered_requests_per_s=None, offered_concurrency=1, cold=False,
                       max_dispatch_lag_ms=10.0, sample_interval_s=0.25)
    # one 2.0 s gap against max(3 x 0.25, 0.25 + 1) = 1.25 s
    assert result.invalid_reasons == ["sampler missed its ticks: sample_gap_s_max 2.00 > 1.25 (interval 0.25 s)"]


def test_scrapes_that_held_the_server_long_qualify_the_latency_tails_but_leave_the_run_valid() -> None:
    def scrapes(every_s: float, durations_s: list[float]) -> list[ServerSample]:
        return [ServerSample(t_s=i * every_s, snapshot=snapshot(0, 0.1, 0, 0), duration_s=duration_s)
                for i, duration_s in enumerate(durations_s)]

    def judged(samples: list[ServerSample], interval_s: float) -> RunSummary:
        return summarize([R1], samples, slo=Slo(), offered_requests_per_s=None, offered_concurrency=1, cold=False,
                         max_dispatch_lag_ms=60.0, sample_interval_s=interval_s)

    # Every 1 s for 4 s, 20, 40, 30, 30 and 30 ms: 150 ms over 4 s + the last 30 ms = 0.150 / 4.030 = 0.0372,
    # mean 150 / 5 = 30 ms.
    busy = judged(scrapes(1.0, [0.020, 0.040, 0.030, 0.030, 0.030]), 1.0)
    assert busy.scrape.scrape_ms_mean == pytest.approx(30.0)
    assert busy.scrape.scrape_share == pytest.approx(0.150 / 4.030)
    assert busy.valid and busy.qualifications[-1] == (  # after R1's own: its last chunk carried 2 tokens
        "latency tails include this run's own /metrics scrapes: scrape_share 0.037 > 0.01 (scrape_ms_mean 30.0 "
        "every 1 s); a longer --sample-interval-s scrapes less")
    # The same scrapes every 5 s: 0.150 / 20.030 = 0.0075, under a hundredth.
    calm = judged(scrapes(5.0, [0.020, 0.040, 0.030, 0.030, 0.030]), 5.0)
    assert calm.scrape.scrape_share == pytest.approx(0.150 / 20.030)
    assert calm.qualifications == busy.qualifications[:-1]
    # A failed scrape has no duration; one timed scrape alone spans nothing.
    assert judged([ServerSample(t_s=0.0, error="ReadTimeout"), *scrapes(1.0, [0.030])], 1.0).scrape.scrape_share is None


def test_a_client_that_sent_late_makes_the_run_invalid() -> None:
    sent_on_time = R1.model_copy(update={"sent_s": 0.0})
    sent_late = R2.model_copy(update={"sent_s": 1.080})  # dispatched at 1.050 s: 30 ms before its bytes left
    result = summarize([sent_on_time, sent_late], [], slo=Slo(), offered_requests_per_s=None, offered_concurrency=1,
                       cold=False, max_dispatch_lag_ms=60.0)
    # send delay [0, 30] ms: p99 = 0.99 x 30 = 29.7 ms; the limit is max(60, 0.05 x TTFT p50 175 ms) = 60 ms
    assert result.latency["send_delay_ms_p99"] == pytest.approx(29.7) and result.valid
    strict = summarize([sent_on_time, sent_late], [], slo=Slo(), offered_requests_per_s=None, offered_concurrency=1,
                       cold=False, max_dispatch_lag_ms=10.0)
    # now the limit is max(10, 8.75) = 10 ms (R2's 50 ms dispatch lag is over it too)
    sent_late_reason = "client sent late: send_delay_ms_p99 29.7 > 10.0"
    assert any(reason.startswith(sent_late_reason) for reason in strict.invalid_reasons)
