"""Objectives and their intervals on worked numbers: a probe decides only when its whole interval does."""

from __future__ import annotations

import pytest
from search_requests import request

from harness.measure.client import ErrorClass, RequestRecord
from harness.search.objective import (
    AttainmentObjective,
    Decision,
    Objective,
    PercentileObjective,
    Reading,
    bootstrap_percentile,
    combined,
    latency_values_ms,
    read_objective,
    ttft_objective,
    wilson_interval,
)


def read(objective: Objective, records: list[RequestRecord]) -> Reading:
    """The objective's reading; these records always give one."""
    reading = read_objective(objective, records)
    assert reading is not None, "the records gave no reading"
    return reading


def test_wilson_interval_on_worked_shares() -> None:
    # 9 of 10: p = 0.9, z² = 3.8415; centre (0.9 + 3.8415/20) / (1 + 3.8415/10) = 0.78898,
    # half 1.96/1.38415 × √(0.09/10 + 3.8415/400) = 0.19314 → [0.5958, 0.9821]
    assert wilson_interval(9, 10) == pytest.approx((0.5958, 0.9821), abs=1e-4)
    # 10 of 10: not [1, 1] as p ± z·se would say — the centre 0.86125 ± 0.13877 → [0.7225, 1.0]
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)


def test_a_bootstrap_interval_of_a_percentile_spans_what_resamples_can_show() -> None:
    # nine requests at 100 ms and one at 1,000 ms. p99 (linear): position 0.99 × 9 = 8.91, so
    # 100 + 0.91 × 900 = 919 ms. A resample misses the slow request with probability 0.9¹⁰ = 0.35 (> 2.5 %):
    # its p99 is then 100, the interval's low end; with two or more copies (p = 0.26 > 2.5 %) it is 1,000.
    value, low, high = bootstrap_percentile([100.0] * 9 + [1000.0], 99)
    assert (value, low, high) == pytest.approx((919.0, 100.0, 1000.0))
    # the same seed, the same interval
    assert bootstrap_percentile([100.0] * 9 + [1000.0], 99) == (value, low, high)


def test_a_percentile_probe_meets_fails_or_stays_undecided_by_its_interval() -> None:
    records = [request(i, 100.0) for i in range(9)] + [request(9, 1000.0)]  # the interval above: [100, 1,000]
    decisions = {limit: read(PercentileObjective(latency="ttft", percentile=99, limit_ms=limit),
                                       records).decision for limit in (1000.0, 500.0, 50.0)}
    # 1,000 ≥ the whole interval: meets; 500 inside it: undecided; 50 below its low end 100: fails
    assert decisions == {1000.0: Decision.MEETS, 500.0: Decision.UNDECIDED, 50.0: Decision.FAILS}
    # twelve slow of twenty: a resample holds fewer than two of them with probability < 1e-6, so every
    # resample's p99 is 1,000 ms and the interval [1,000, 1,000] lies wholly above 500
    slow = [request(i, 100.0) for i in range(8)] + [request(8 + i, 1000.0) for i in range(12)]
    reading = read(PercentileObjective(latency="ttft", percentile=99, limit_ms=500), slow)
    assert reading.decision == Decision.FAILS and reading.low == reading.high == 1000.0 and reading.requests == 20


def test_warm_up_and_failed_requests_are_left_out_of_latencies_but_fail_attainment() -> None:
    records = [request(0, 5000.0, warmup=True), request(1, 100.0), request(2, 200.0),
               request(3, 0.0, error=ErrorClass.timeout)]
    assert latency_values_ms(records, "ttft") == pytest.approx([100.0, 200.0])
    # 10 tokens after the first, 10 ms apart: TPOT 10 ms; e2e = ttft + 100 ms
    assert latency_values_ms(records, "tpot") == pytest.approx([10.0, 10.0])
    assert latency_values_ms(records, "e2e") == pytest.approx([200.0, 300.0])
    attainment = read(AttainmentObjective(ttft_ms=150, target_share=0.5), records)
    # of the 3 measured, only the 100 ms one meets TTFT ≤ 150: 1/3, Wilson [0.0615, 0.7923]: straddles 0.5
    assert attainment.value == pytest.approx(1 / 3) and attainment.requests == 3
    assert attainment.low == pytest.approx(0.0615, abs=1e-4) and attainment.decision == Decision.UNDECIDED


def test_an_attainment_probe_decides_on_its_wilson_interval() -> None:
    met = [request(i, 100.0) for i in range(19)] + [request(19, 900.0)]
    # 19 of 20 meet TTFT ≤ 500: Wilson [0.7639, 0.9911]; a 0.75 target is below it (meets), 0.95 inside it
    assert read(AttainmentObjective(ttft_ms=500, target_share=0.75), met).decision == Decision.MEETS
    assert read(AttainmentObjective(ttft_ms=500, target_share=0.95), met).decision == Decision.UNDECIDED
    missed = [request(i, 900.0) for i in range(20)]  # none meets: Wilson [0, 0.1611] < 0.5
    assert read(AttainmentObjective(ttft_ms=500, target_share=0.5), missed).decision == Decision.FAILS


def test_every_objective_must_hold() -> None:
    assert combined([Decision.MEETS, Decision.FAILS]) == Decision.FAILS
    assert combined([Decision.MEETS, Decision.UNDECIDED]) == Decision.UNDECIDED
    assert combined([Decision.MEETS, Decision.MEETS]) == Decision.MEETS
    assert combined([]) == Decision.UNDECIDED  # nothing read decides nothing


def test_a_ttft_limit_in_the_machines_unit_is_six_lone_prefills_rounded_up_to_50_ms() -> None:
    # 6 × 241 ms = 1,446 ms, up to 1,450; 6 × 40 ms = 240 ms, up to 250; 6 × 50 ms = 300 ms exactly
    assert [ttft_objective(ms).limit_ms for ms in (241.0, 40.0, 50.0)] == [1450, 250, 300]
    assert ttft_objective(241.0).words == "p99 TTFT ≤ 1,450 ms"
