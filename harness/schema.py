"""What a run leaves on disk and the names of the figures it reports, in one place.

The record's files are named here and nowhere else. `Output` names every output the analysis, the report
and the dashboard read, `Input` every input: the analysis cites `Output.TTFT_MS_P99`, never a string, and
tests hold the names against the figures contract (`measure.figures`), the components' declared outputs
(`tests/test_schema.py`) and what a record can give (`tests/launch/test_cluster_path.py`), so a renamed
figure fails a test instead of reading as a silent None.
The models of the stages' own records stay beside the code that writes them (`measure/record.py`,
`measure/stats.py`, `observe/capacity.py`, `observe/device.py`): they are built from that stage's types,
and a base module importing them would make every stage depend on every other.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel


class RunFile:
    """Every file of a run record directory (plain strings: pathlib cannot intern an enum member)."""

    CONFIG: Final = "config.json"  # what was asked (`measure.record.RunConfig`)
    ENVIRONMENT: Final = "environment.json"  # what answered (`measure.record.Environment`)
    ENGINE: Final = "engine.json"  # the engine's command line and limits (`EngineRecord`)
    DEVICE: Final = "device.json"  # the device and its memory peaks (`observe.device.DeviceRecord`)
    CAPACITY: Final = "capacity.json"  # logged and predicted KV capacity (`observe.capacity.CapacityReport`)
    ENGINE_LOG: Final = "engine.log"  # the engine's start-up log, verbatim
    SUMMARY: Final = "summary.json"  # the run's figures (`measure.figures.RunSummary`)
    REQUESTS: Final = "requests.jsonl"  # one `measure.client.RequestRecord` per line, appended as each ends
    REQUESTS_PARQUET: Final = "requests.parquet"  # the same, columnar, written at the end
    SAMPLES: Final = "samples.jsonl"  # one `measure.record.ServerSample` per /metrics scrape
    TRACKING: Final = "tracking.json"  # the Polyaxon run this record became (`TrackedRun`)


# A server's start-up log, for a run that measures a server it did not start (its limits and capacity).
SERVICE_LOG_ENV: Final = "HARNESS_SERVICE_LOG"


class EngineRecord(BaseModel):
    """engine.json: how the engine was started (argv when this run started it), the limits a comparison
    holds fixed or varies, and the images by digest."""

    argv: list[str] | None = None
    limits: dict[str, Any] = {}
    image_reference: str | None = None
    container_image: str | None = None


class TrackedRun(BaseModel):
    """tracking.json: the Polyaxon run a record became; analysis joins on its UUID."""

    run_uuid: str
    owner: str
    project: str
    offline_root: str | None


class Input(StrEnum):
    """A run's inputs that the analysis reads: the engine's limits and the workload, under their dashboard names."""

    BLOCK_SIZE = "block_size"
    CONCURRENCY = "concurrency"
    GPU_MEMORY_UTILIZATION = "gpu_memory_utilization"
    KV_CACHE_MEMORY_BYTES = "kv_cache_memory_bytes"
    MAX_CONCURRENCY = "max_concurrency"
    MAX_MODEL_LEN = "max_model_len"
    MAX_NUM_SEQS = "max_num_seqs"
    RATE_PER_S = "rate_per_s"
    SERVICE_UUID = "service_uuid"
    TENSOR_PARALLEL_SIZE = "tensor_parallel_size"


class Output(StrEnum):
    """A run's outputs that the analysis reads, under their dashboard names (unit last)."""

    ACHIEVED_CONCURRENCY_MEAN = "achieved_concurrency_mean"
    ACTIVATION_PEAK_BYTES_BEFORE_LAUNCH = "activation_peak_bytes_before_launch"
    ACTIVATION_PEAK_BYTES_LOGGED = "activation_peak_bytes_logged"
    BURST_TOKEN_FRACTION = "burst_token_fraction"
    CLIENT_E2E_MS_MEAN = "client_e2e_ms_mean"
    CUDA_GRAPHS_BYTES_BEFORE_LAUNCH = "cuda_graphs_bytes_before_launch"
    CUDA_GRAPHS_BYTES_LOGGED = "cuda_graphs_bytes_logged"
    DISPATCH_LAG_MS_P99 = "dispatch_lag_ms_p99"
    DRIFT_TERM = "drift_term"
    E2E_MS_P99 = "e2e_ms_p99"
    ENGINE_DECODE_MS_MEAN = "engine_decode_ms_mean"
    ENGINE_ERROR = "engine_error"
    ENGINE_FAILURE_STAGE = "engine_failure_stage"
    ENGINE_ITL_MS_MEAN = "engine_itl_ms_mean"
    ENGINE_PREFILL_MS_MEAN = "engine_prefill_ms_mean"
    ENGINE_QUEUE_MS_MEAN = "engine_queue_ms_mean"
    ENGINE_RUNNING_REQUESTS_MEAN = "engine_running_requests_mean"
    ENGINE_STARTED = "engine_started"
    ENGINE_WAITING_REQUESTS_MEAN = "engine_waiting_requests_mean"
    ERROR_RATE_FRACTION = "error_rate_fraction"
    ERRORS_CANCELLED = "errors_cancelled"
    FRONTEND_MS_MEAN = "frontend_ms_mean"
    FRONTEND_SHARE = "frontend_share"
    INVALID_REASONS = "invalid_reasons"
    KV_CACHE_TOKENS_BEFORE_LAUNCH = "kv_cache_tokens_before_launch"
    KV_CACHE_TOKENS_DRIFT_SHARE = "kv_cache_tokens_drift_share"
    KV_CACHE_TOKENS_LOGGED = "kv_cache_tokens_logged"
    KV_CACHE_TOKENS_PREDICTED = "kv_cache_tokens_predicted"
    KV_MEMORY_BYTES_BEFORE_LAUNCH = "kv_memory_bytes_before_launch"
    KV_MEMORY_BYTES_LOGGED = "kv_memory_bytes_logged"
    LARGEST_BURST_TOKENS = "largest_burst_tokens"
    LOOP_LAG_MS_MAX = "loop_lag_ms_max"
    LOOP_STALL_SHARE = "loop_stall_share"
    MAX_CONCURRENCY_LOGGED = "max_concurrency_logged"
    MAX_CONCURRENCY_PREDICTED = "max_concurrency_predicted"
    MAX_ERROR_FRACTION = "max_error_fraction"
    MODEL_WEIGHTS_BYTES_LOGGED = "model_weights_bytes_logged"
    NON_TORCH_BYTES_BEFORE_LAUNCH = "non_torch_bytes_before_launch"
    NON_TORCH_BYTES_LOGGED = "non_torch_bytes_logged"
    NUM_BLOCKS_LOGGED = "num_blocks_logged"
    NUM_BLOCKS_PREDICTED = "num_blocks_predicted"
    OUTPUT_TOKENS_PER_S = "output_tokens_per_s"
    PEAK_KV_CACHE_USAGE_FRACTION = "peak_kv_cache_usage_fraction"
    PEAK_WAITING_REQUESTS = "peak_waiting_requests"
    PER_TOKEN_LATENCY_PACED = "per_token_latency_paced"
    POPULATION_BLOCK_SIZE_TOKENS = "population_block_size_tokens"
    POPULATION_FIT_SHARE_PREDICTED = "population_fit_share_predicted"
    POPULATION_LIVE_REQUESTS = "population_live_requests"
    POPULATION_PADDED_TOKENS_MAX_PREDICTED = "population_padded_tokens_max_predicted"
    POPULATION_PADDED_TOKENS_P50_PREDICTED = "population_padded_tokens_p50_predicted"
    POPULATION_PADDED_TOKENS_P99_PREDICTED = "population_padded_tokens_p99_predicted"
    POPULATION_PEAK_TOKENS_MEASURED = "population_peak_tokens_measured"
    POPULATION_USABLE_BLOCKS = "population_usable_blocks"
    PREDICTION_MATCHES_LOG = "prediction_matches_log"
    PREEMPTIONS_DURING_RUN = "preemptions_during_run"
    PREFIX_CACHE_HIT_TOKENS_MEASURED = "prefix_cache_hit_tokens_measured"
    PREFIX_CACHE_HIT_TOKENS_PREDICTED = "prefix_cache_hit_tokens_predicted"
    PREFIX_CACHE_HITS_AS_PREDICTED = "prefix_cache_hits_as_predicted"
    PROMPT_TOKENS_PER_S = "prompt_tokens_per_s"
    QUALIFICATIONS = "qualifications"
    REQUESTS_MEASURED = "requests_measured"
    REQUESTS_OK = "requests_ok"
    REQUESTS_PER_S = "requests_per_s"
    SAMPLE_GAP_S_MAX = "sample_gap_s_max"
    SEND_DELAY_MS_P99 = "send_delay_ms_p99"
    TPOT_MS_P50 = "tpot_ms_p50"
    TPOT_MS_P99 = "tpot_ms_p99"
    TTFT_MS_P50 = "ttft_ms_p50"
    TTFT_MS_P99 = "ttft_ms_p99"
    VALID = "valid"
    WEIGHTS_BYTES_BEFORE_LAUNCH = "weights_bytes_before_launch"
    WEIGHTS_BYTES_LOGGED = "weights_bytes_logged"
