"""Every diagnosis branch on constructed run records, each verdict checked for the figures it cites."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from analysis.compare import compare_one_limit
from analysis.diagnose import (
    CLIENT,
    COMPUTE,
    FRONTEND,
    KV_CAPACITY,
    NO_LIMIT,
    RULES,
    SCHEDULING,
    SERVER_FAILED,
    WEIGHTS,
    Verdict,
    diagnose,
    diagnose_runs,
    lowest_load_run,
)
from analysis.sources import runs_from_directories
from analysis.table import build_table
from harness.measure.client import ErrorClass

from run_records import STARVED_LOG, write_failed_run, write_run


def row_of(run_dir: Path) -> pd.Series:
    row = build_table(runs_from_directories([run_dir])).frame.loc[run_dir.name]
    assert isinstance(row, pd.Series)  # one run per UUID
    return row


def verdict_of(run_dir: Path) -> Verdict:
    return diagnose(run_dir.name, row_of(run_dir), None)


def test_engine_that_failed_to_start_is_weights_and_headroom(tmp_path: Path) -> None:
    verdict = verdict_of(write_failed_run(tmp_path))
    assert verdict.bound_by == WEIGHTS
    assert "No available memory for the cache blocks" in verdict.text  # the crash log's own words
    assert "engine_failure_stage=" in verdict.text
    assert "kv_cache_memory_bytes=1073741824" in verdict.text


def test_a_dead_server_is_named_instead_of_a_limit(tmp_path: Path) -> None:
    # 2 answered, then 6 refused and 2 reset: 8 failed of 10 = 0.8 > 0.05. The queue beside a full cache
    # would otherwise say KV capacity.
    refused, reset = ErrorClass.connection_refused, ErrorClass.connection_reset
    run_dir = write_run(tmp_path, requests=2, failed=(refused,) * 6 + (reset,) * 2,
                        samples=[(0, 4, 0.5, 0), (3, 4, 0.95, 0)])
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == SERVER_FAILED
    for cited in ("error_rate_fraction=0.8", "max_error_fraction=0.05", "errors_connection_refused=6",
                  "errors_connection_reset=2", "requests_ok=2"):
        assert cited in verdict.evidence
    assert verdict.evidence[-1].startswith("threshold: error_rate_fraction above the run's max_error_fraction")


def test_a_few_failed_requests_under_the_threshold_leave_the_limit_verdict(tmp_path: Path) -> None:
    # 1 timeout of 40 = 0.025 <= 0.05: the queue beside a full cache still says KV capacity.
    run_dir = write_run(tmp_path, requests=39, failed=(ErrorClass.timeout,), samples=[(0, 4, 0.5, 0), (3, 4, 0.95, 0)])
    assert verdict_of(run_dir).bound_by == KV_CAPACITY


def test_client_that_fell_behind_is_an_invalid_measurement(tmp_path: Path) -> None:
    verdict = verdict_of(write_run(tmp_path, dispatch_lag_ms=50.0))  # the record allows 10 ms
    assert verdict.bound_by == CLIENT
    assert "dispatch_lag_ms_p99=50" in verdict.evidence
    assert "client fell behind its schedule" in verdict.text


def test_preemption_is_kv_capacity_even_without_a_queue(tmp_path: Path) -> None:
    verdict = verdict_of(write_run(tmp_path, samples=[(0, 4, 0.5, 0), (0, 4, 0.7, 2)]))
    assert verdict.bound_by == KV_CAPACITY
    assert "preemptions_during_run=2" in verdict.evidence
    assert "peak_kv_cache_usage_fraction=0.7" in verdict.evidence


def test_queue_beside_a_full_cache_is_kv_capacity(tmp_path: Path) -> None:
    verdict = verdict_of(write_run(tmp_path, samples=[(0, 4, 0.5, 0), (3, 4, 0.95, 0)]))
    assert verdict.bound_by == KV_CAPACITY
    assert "peak_waiting_requests=3" in verdict.evidence and "peak_kv_cache_usage_fraction=0.95" in verdict.evidence


def test_queue_with_more_live_tokens_than_the_logged_cache_is_kv_capacity(tmp_path: Path) -> None:
    # 8 running x (500 prompt + 20 output) = 4,160 live tokens > 4,096 logged; the scrapes saw 60 % usage
    run_dir = write_run(tmp_path, limits={"max_num_seqs": 8}, concurrency=8, prompt_tokens=500, output_tokens=20,
                        log=STARVED_LOG, samples=[(2, 6, 0.6, 0)])
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == KV_CAPACITY
    # 520 tokens take ceil(520 / 128) = 5 blocks of 128, so 8 sequences hold 8 x 640 = 5,120 tokens; the cache's
    # 32 logged blocks less the null block hold 31 x 128 = 3,968
    assert "kv_tokens_needed_padded=5120" in verdict.evidence
    assert "kv_cache_tokens_usable=3968" in verdict.evidence


def test_queue_with_a_roomy_cache_is_max_num_seqs(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, limits={"max_num_seqs": 2}, concurrency=4, samples=[(2, 2, 0.01, 0), (1, 2, 0.02, 0)])
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == SCHEDULING
    for cited in ("peak_waiting_requests=2", "max_num_seqs=2", "concurrency=4"):
        assert cited in verdict.evidence
    # only max_num_seqs=2 of the 4 in flight hold KV blocks: 2 x (100 + 20) tokens, one 128-token block each
    assert "kv_tokens_needed_padded=256" in verdict.evidence


def test_latency_up_without_memory_pressure_is_compute_against_the_lowest_load(tmp_path: Path) -> None:
    quiet = write_run(tmp_path, concurrency=1, tpot_ms=10.0, samples=[(0, 1, 0.01, 0)])
    busier = write_run(tmp_path, concurrency=2, tpot_ms=15.0, samples=[(0, 2, 0.02, 0)])  # 1.5x: not yet
    saturated = write_run(tmp_path, concurrency=4, tpot_ms=25.0, samples=[(0, 4, 0.04, 0)])  # 2.5x
    comparison = compare_one_limit(build_table(runs_from_directories([tmp_path])), "concurrency")
    assert lowest_load_run(comparison.runs) == quiet.name
    verdicts = {verdict.run_uuid: verdict for verdict in diagnose_runs(comparison.runs, "concurrency")}
    assert verdicts[quiet.name].bound_by == NO_LIMIT
    assert verdicts[busier.name].bound_by == NO_LIMIT
    assert verdicts[saturated.name].bound_by == COMPUTE
    evidence = verdicts[saturated.name].evidence
    assert "tpot_ms_p50_growth=2.5" in evidence and "tpot_ms_p50=25" in evidence  # 25 / 10
    assert f"baseline run {quiet.name} (concurrency=1)" in evidence
    assert "ttft_ms_p99_growth=1" in evidence  # TTFT did not grow (50 ms each)


def test_run_killed_before_its_summary_is_an_invalid_measurement(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path)
    (run_dir / "summary.json").unlink()  # what a SIGKILL leaves: config, requests.jsonl, samples, no summary
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == CLIENT
    assert verdict.evidence[0] == "summary missing: the run recorded no figures"


def figures_row(uuid: str, **figures: object) -> pd.Series:
    """A run as the table holds it: 8 in flight over max_num_seqs 8, 64 + 64 tokens per request (one 128-token
    block each), a cache of 33 logged blocks (32 usable = 4,096 tokens), TTFT 100 ms and TPOT 10 ms."""
    base = {"engine_started": True, "valid": True, "requests_ok": 100, "concurrency": 8, "max_num_seqs": 8,
            "block_size": 128, "num_blocks_logged": 33, "kv_cache_tokens_logged": 33 * 128, "requests_per_s": 10.0,
            "prompt_tokens_per_s": 640.0, "output_tokens_per_s": 640.0, "ttft_ms_p99": 100.0, "tpot_ms_p50": 10.0,
            "preemptions_during_run": 0, "peak_waiting_requests": 0, "engine_waiting_requests_mean": 0.001,
            "peak_kv_cache_usage_fraction": 0.25, "frontend_share": 0.05, "per_token_latency_paced": True}
    return pd.Series({**base, **figures}, name=uuid)


def test_a_queue_no_scrape_caught_is_still_the_sequence_cap() -> None:
    # 8 in flight, max_num_seqs 1: the queue-time histogram says 6.8 requests waited on average (Little's law),
    # although every scrape landed on an empty queue
    row = figures_row("capped", max_num_seqs=1, peak_waiting_requests=0, engine_waiting_requests_mean=6.8)
    verdict = diagnose("capped", row, None)
    assert verdict.bound_by == SCHEDULING
    assert "engine_waiting_requests_mean=6.8" in verdict.evidence and "max_num_seqs=1" in verdict.evidence


def test_block_padding_makes_a_cache_that_holds_the_raw_tokens_too_small() -> None:
    # 4 sequences of 600 + 300 = 900 tokens: 3,600 raw tokens fit 4,096 logged, but each takes ceil(900 / 128) = 8
    # blocks, 4 x 8 x 128 = 4,096 > 31 usable blocks x 128 = 3,968
    row = figures_row("padded", max_num_seqs=4, requests_per_s=1.0, prompt_tokens_per_s=600.0,
                      output_tokens_per_s=300.0, num_blocks_logged=32, kv_cache_tokens_logged=4096,
                      engine_waiting_requests_mean=3.0, peak_kv_cache_usage_fraction=0.42)
    verdict = diagnose("padded", row, None)
    assert verdict.bound_by == KV_CAPACITY
    assert "kv_tokens_needed_padded=4096" in verdict.evidence and "kv_cache_tokens_usable=3968" in verdict.evidence


def test_time_spent_outside_the_engine_is_the_serving_front_end() -> None:
    row = figures_row("front", frontend_share=0.62, frontend_ms_mean=310.0, client_e2e_ms_mean=500.0)
    verdict = diagnose("front", row, None)
    assert verdict.bound_by == FRONTEND
    assert "frontend_share=0.62" in verdict.evidence and "frontend_ms_mean=310" in verdict.evidence


def test_every_verdict_is_implied_by_the_evidence_it_cites() -> None:
    """Over a grid of runs that reaches every rule, the chosen rule holds on the cited figures alone."""
    baseline = figures_row("baseline")
    grid = itertools.product(
        [True, False],  # engine started
        [True, False],  # valid
        [0.0, 0.5],  # error_rate_fraction against max_error_fraction 0.05
        [0, 3],  # preemptions
        [0.0, 4.0],  # engine_waiting_requests_mean
        [0, 2],  # peak_waiting_requests
        [0.1, 0.95],  # peak_kv_cache_usage_fraction
        [8, 1],  # max_num_seqs (8 x one block > 4 usable blocks below; 1 block fits)
        [0.05, 0.7],  # frontend_share
        [100.0, 300.0],  # ttft_ms_p99 against the baseline's 100
    )
    reached = set()
    for index, point in enumerate(grid):
        started, valid, failed, preempted, waiting_mean, waiting_peak, usage, seqs, front, ttft = point
        row = figures_row(f"run{index}", engine_started=started, valid=valid, error_rate_fraction=failed,
                          max_error_fraction=0.05, preemptions_during_run=preempted,
                          engine_waiting_requests_mean=waiting_mean, peak_waiting_requests=waiting_peak,
                          peak_kv_cache_usage_fraction=usage, max_num_seqs=seqs, num_blocks_logged=5,
                          kv_cache_tokens_logged=5 * 128, frontend_share=front, ttft_ms_p99=ttft)
        verdict = diagnose(str(row.name), row, baseline)
        rule = next(rule for rule in RULES if rule.bound_by == verdict.bound_by)
        assert rule.holds(verdict.figures), verdict.text
        reached.add(verdict.bound_by)
    assert reached == {rule.bound_by for rule in RULES}
