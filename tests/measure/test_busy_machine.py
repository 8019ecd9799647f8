"""The verdicts tests excuse on a busy machine are the harness's own, and only its client-health ones."""

import inspect

from harness.measure import stats

from conftest import BUSY_MACHINE_REASONS, invalid_but_for_a_busy_machine


def test_each_excused_verdict_is_one_the_summary_gives() -> None:
    source = inspect.getsource(stats.validity_problems)
    assert len(BUSY_MACHINE_REASONS) == 4
    assert [prefix for prefix in BUSY_MACHINE_REASONS if f'f"{prefix}' not in source] == []


def test_a_failing_server_or_a_warm_cache_is_never_excused() -> None:
    reasons = ["client event loop stalled: loop_stall_share 0.208 > 0.050 (...; loop_lag_ms_max 412)",
               "requests failed: error_rate_fraction 0.125 > 0.05", "run declared cold but the prefix cache hit 128 "
               "tokens", "sampler missed its ticks: sample_gap_s_max 12.00 > 7.50 (interval 5 s)"]
    assert invalid_but_for_a_busy_machine(reasons) == reasons[1:3]
