"""Read the few /metrics figures that explain a serving run, whatever vLLM version exported them.

vLLM renamed several metrics across releases and labels every sample with an `engine` index (one per
data-parallel engine), so the snapshot keeps one value per figure: summed over engines, looked up
under the current name first and the pre-0.9.2 name second, and None when the server does not export it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import httpx
import pydantic
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from harness.errors import HarnessError
from harness.server_url import checked_server_url
from harness.units import abbreviated

METRICS_SCHEMA_VERSION = 1

# Each figure, in lookup order: the current sample name, then the name older releases used.
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = ("vllm:num_preemptions_total",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# vLLM's own per-request latency histograms (seconds), by snapshot field: where the engine spent each
# request's time, which no client or front-end delay can inflate. Inter-token latency was
# `time_per_output_token_seconds` before 0.11.
ENGINE_HISTOGRAMS = {
    "request_queue_time_seconds": ("vllm:request_queue_time_seconds",),
    "request_prefill_time_seconds": ("vllm:request_prefill_time_seconds",),
    "request_decode_time_seconds": ("vllm:request_decode_time_seconds",),
    "time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "inter_token_latency_seconds": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
}


class HistogramBucket(pydantic.BaseModel):
    """One cumulative bucket: how many observations were at most `le` (in the histogram's unit)."""

    model_config = pydantic.ConfigDict(ser_json_inf_nan="strings")

    le: float
    count: float


class Histogram(pydantic.BaseModel):
    """A Prometheus histogram summed over engines; its unit is the one its field name carries."""

    model_config = pydantic.ConfigDict(ser_json_inf_nan="strings")

    buckets: list[HistogramBucket]
    sum: float
    count: float


class MetricsSnapshot(pydantic.BaseModel):
    """One scrape of /metrics reduced to the figures the harness records and compares."""

    schema_version: int = METRICS_SCHEMA_VERSION
    num_requests_running: int | None = None
    num_requests_waiting: int | None = None
    kv_cache_usage_fraction: float | None = None
    num_preemptions_total: int | None = None
    prefix_cache_queries_total: int | None = None
    prefix_cache_hits_total: int | None = None
    prompt_tokens_total: int | None = None
    generation_tokens_total: int | None = None
    request_queue_time_seconds: Histogram | None = None
    request_prefill_time_seconds: Histogram | None = None
    request_decode_time_seconds: Histogram | None = None
    time_to_first_token_seconds: Histogram | None = None
    inter_token_latency_seconds: Histogram | None = None
    e2e_request_latency_seconds: Histogram | None = None
    cache_config: dict[str, str] | None = None


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse a Prometheus text exposition; a malformed text is bad input, a missing metric is None."""
    samples = _samples(text)
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_name[sample.name].append(sample)

    def summed(names: tuple[str, ...]) -> float | None:
        for name in names:
            if name in by_name:
                return _finite(name, sum(sample.value for sample in by_name[name]))
        return None

    def counted(names: tuple[str, ...]) -> int | None:
        value = summed(names)
        return None if value is None else round(value)

    return MetricsSnapshot(
        num_requests_running=counted(RUNNING),
        num_requests_waiting=counted(WAITING),
        kv_cache_usage_fraction=_mean_over_engines(by_name, KV_CACHE_USAGE),
        num_preemptions_total=counted(PREEMPTIONS),
        prefix_cache_queries_total=counted(PREFIX_QUERIES),
        prefix_cache_hits_total=counted(PREFIX_HITS),
        prompt_tokens_total=counted(PROMPT_TOKENS),
        generation_tokens_total=counted(GENERATION_TOKENS),
        **{field: _histogram(by_name, names) for field, names in ENGINE_HISTOGRAMS.items()},
        cache_config=_cache_config(by_name.get(CACHE_CONFIG_INFO, [])),
    )


def fetch_metrics_text(url: str, timeout_seconds: float = 10.0) -> str:
    """GET a /metrics page; a malformed URL, an unreachable server or an error status is one line of bad input."""
    checked_server_url(url, "--metrics")
    try:
        response = httpx.get(url, timeout=timeout_seconds)
        response.raise_for_status()
    except httpx.HTTPError as error:
        raise HarnessError(f"{url}: could not read metrics: {error}") from None
    return response.text


def _samples(text: str) -> list[Sample]:
    try:
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except (ValueError, IndexError, KeyError, TypeError) as error:
        raise HarnessError(f"not in Prometheus exposition format: {error}") from None


def _mean_over_engines(by_name: dict[str, list[Sample]], names: tuple[str, ...]) -> float | None:
    """A usage fraction does not add up across engines (each is 0-1), so engines are averaged."""
    for name in names:
        if name in by_name:
            values = [_finite(name, sample.value) for sample in by_name[name]]
            return _finite(name, sum(values) / len(values))
    return None


def _histogram(by_name: dict[str, list[Sample]], names: tuple[str, ...]) -> Histogram | None:
    name = next((name for name in names if f"{name}_bucket" in by_name), None)
    if name is None:
        return None
    bucket_samples = by_name[f"{name}_bucket"]
    counts_by_bound: dict[float, float] = defaultdict(float)
    for sample in bucket_samples:
        bound = _bucket_bound(name, sample.labels.get("le", ""))
        counts_by_bound[bound] += _finite(f"{name}_bucket", sample.value)
    buckets = [HistogramBucket(le=bound, count=counts_by_bound[bound]) for bound in sorted(counts_by_bound)]
    return Histogram(
        buckets=buckets,
        sum=_total(f"{name}_sum", by_name.get(f"{name}_sum", [])),
        count=_total(f"{name}_count", by_name.get(f"{name}_count", [])),
    )


def _total(name: str, samples: Iterable[Sample]) -> float:
    return _finite(name, sum(sample.value for sample in samples))


def _finite(name: str, value: float) -> float:
    """NaN or infinity where vLLM exports a count, a gauge or a sum: not a scrape the figures can come from. The
    parser gives a value written without a point as an int, which can be past any float."""
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise HarnessError(f"{name}: {abbreviated(str(value))} is not a finite number")
    return value


def _bucket_bound(name: str, le: str) -> float:
    """A bucket's upper bound: a number or +Inf (the last bucket), never NaN."""
    try:
        bound = float(le)
    except ValueError:
        bound = math.nan
    if math.isnan(bound):
        raise HarnessError(f"{name}_bucket: le={le!r} is not a bucket bound")
    return bound


def label_count(label: str | None) -> int | None:
    """A cache_config_info label that is a count, else None: vLLM writes 'None' for a cache not yet sized, and
    only ASCII digits for a count ('１２'.isdigit() is true, int('x') is an error)."""
    return int(label) if label is not None and label.isascii() and label.isdigit() else None


def _cache_config(samples: list[Sample]) -> dict[str, str] | None:
    """The first engine's labels: vLLM already sums num_gpu_blocks over data-parallel engines."""
    if not samples:
        return None
    first = min(samples, key=lambda sample: _engine_order(sample.labels.get("engine", "")))
    return {key: value for key, value in first.labels.items() if key != "engine"}


def _engine_order(engine: str) -> float:
    return float(engine) if engine.isdigit() else math.inf
