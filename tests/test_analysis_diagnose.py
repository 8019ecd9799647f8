"""Every diagnosis branch on constructed run records, each verdict checked for the figures it cites."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.compare import compare_one_limit
from analysis.diagnose import (
    CLIENT,
    COMPUTE,
    KV_CAPACITY,
    NO_LIMIT,
    SCHEDULING,
    SERVER_FAILED,
    WEIGHTS,
    diagnose,
    diagnose_runs,
    lowest_load_run,
)
from analysis.sources import runs_from_directories
from analysis.table import build_table

from harness.client import ErrorClass
from test_analysis_records import STARVED_LOG, write_failed_run, write_run


def row_of(run_dir: Path) -> pd.Series:
    return build_table(runs_from_directories([run_dir])).frame.loc[run_dir.name]


def verdict_of(run_dir: Path):
    return diagnose(run_dir.name, row_of(run_dir), None)


def test_engine_that_failed_to_start_is_weights_and_headroom(tmp_path: Path):
    verdict = verdict_of(write_failed_run(tmp_path))
    assert verdict.bound_by == WEIGHTS
    assert "No available memory for the cache blocks" in verdict.text  # the crash log's own words
    assert "engine_failure_stage=" in verdict.text
    assert "kv_cache_memory_bytes=1073741824" in verdict.text


def test_a_dead_server_is_named_instead_of_a_limit(tmp_path: Path):
    # 2 answered, then 6 refused and 2 reset: 8 failed of 10 = 0.8 > 0.05. The queue beside a full cache
    # would otherwise say KV capacity.
    refused, reset = ErrorClass.connection_refused, ErrorClass.connection_reset
    run_dir = write_run(tmp_path, requests=2, failed=(refused,) * 6 + (reset,) * 2,
                        samples=[(0, 4, 0.5, 0), (3, 4, 0.95, 0)])
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == SERVER_FAILED
    assert verdict.evidence[:3] == ["error_rate_fraction=0.8", "errors_connection_refused=6",
                                    "errors_connection_reset=2"]
    assert "requests_ok=2" in verdict.evidence and "threshold: error_rate_fraction>0.05" in verdict.evidence


def test_a_few_failed_requests_under_the_threshold_leave_the_limit_verdict(tmp_path: Path):
    # 1 timeout of 40 = 0.025 <= 0.05: the queue beside a full cache still says KV capacity.
    run_dir = write_run(tmp_path, requests=39, failed=(ErrorClass.timeout,), samples=[(0, 4, 0.5, 0), (3, 4, 0.95, 0)])
    assert verdict_of(run_dir).bound_by == KV_CAPACITY


def test_client_that_fell_behind_is_an_invalid_measurement(tmp_path: Path):
    verdict = verdict_of(write_run(tmp_path, dispatch_lag_ms=50.0))  # the record allows 10 ms
    assert verdict.bound_by == CLIENT
    assert "dispatch_lag_ms_p99=50" in verdict.evidence
    assert "client fell behind its schedule" in verdict.text


def test_preemption_is_kv_capacity_even_without_a_queue(tmp_path: Path):
    verdict = verdict_of(write_run(tmp_path, samples=[(0, 4, 0.5, 0), (0, 4, 0.7, 2)]))
    assert verdict.bound_by == KV_CAPACITY
    assert "preemptions_during_run=2" in verdict.evidence
    assert "peak_kv_cache_usage_fraction=0.7" in verdict.evidence


def test_queue_beside_a_full_cache_is_kv_capacity(tmp_path: Path):
    verdict = verdict_of(write_run(tmp_path, samples=[(0, 4, 0.5, 0), (3, 4, 0.95, 0)]))
    assert verdict.bound_by == KV_CAPACITY
    assert "peak_waiting_requests=3" in verdict.evidence and "peak_kv_cache_usage_fraction=0.95" in verdict.evidence


def test_queue_with_more_live_tokens_than_the_logged_cache_is_kv_capacity(tmp_path: Path):
    # 8 running x (500 prompt + 20 output) = 4,160 live tokens > 4,096 logged; the scrapes saw 60 % usage
    run_dir = write_run(tmp_path, limits={"max_num_seqs": 8}, concurrency=8, prompt_tokens=500, output_tokens=20,
                        log=STARVED_LOG, samples=[(2, 6, 0.6, 0)])
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == KV_CAPACITY
    assert "kv_cache_tokens_logged=4096" in verdict.evidence
    assert any(item.startswith("live_tokens=4160 tokens (8 sequences × (prompt 500 + output 20") for item in verdict.evidence)


def test_queue_with_a_roomy_cache_is_max_num_seqs(tmp_path: Path):
    run_dir = write_run(tmp_path, limits={"max_num_seqs": 2}, concurrency=4, samples=[(2, 2, 0.01, 0), (1, 2, 0.02, 0)])
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == SCHEDULING
    for cited in ("peak_waiting_requests=2", "peak_running_requests=2", "max_num_seqs=2", "concurrency=4"):
        assert cited in verdict.evidence
    # only max_num_seqs=2 of the 4 in flight hold KV blocks: 2 x (100 + 20)
    assert any(item.startswith("live_tokens=240 tokens") for item in verdict.evidence)


def test_latency_up_without_memory_pressure_is_compute_against_the_lowest_load(tmp_path: Path):
    quiet = write_run(tmp_path, concurrency=1, tpot_ms=10.0, samples=[(0, 1, 0.01, 0)])
    busier = write_run(tmp_path, concurrency=2, tpot_ms=15.0, samples=[(0, 2, 0.02, 0)])  # 1.5x: not yet
    saturated = write_run(tmp_path, concurrency=4, tpot_ms=25.0, samples=[(0, 4, 0.04, 0)])  # 2.5x
    comparison = compare_one_limit(build_table(runs_from_directories([tmp_path])), "concurrency")
    assert lowest_load_run(comparison.runs) == quiet.name
    verdicts = {verdict.run_uuid: verdict for verdict in diagnose_runs(comparison.runs, "concurrency")}
    assert verdicts[quiet.name].bound_by == NO_LIMIT
    assert verdicts[busier.name].bound_by == NO_LIMIT
    assert verdicts[saturated.name].bound_by == COMPUTE
    assert f"tpot_ms_p50=25 vs 10 at baseline run {quiet.name} (concurrency=1)" in verdicts[saturated.name].evidence
    assert "threshold: 2x the baseline" in verdicts[saturated.name].evidence
    assert "ttft_ms_p99" not in verdicts[saturated.name].text.split(";")[0]  # TTFT did not grow (50 ms each)


def test_run_killed_before_its_summary_is_an_invalid_measurement(tmp_path: Path):
    run_dir = write_run(tmp_path)
    (run_dir / "summary.json").unlink()  # what a SIGKILL leaves: config, requests.jsonl, samples, no summary
    verdict = verdict_of(run_dir)
    assert verdict.bound_by == CLIENT
    assert verdict.evidence == ["summary missing: the run recorded no figures"]
