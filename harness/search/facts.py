"""The engine's facts a search needs — usable blocks, block size, max_num_seqs, KV bytes — from what says them.

An engine the search started states its limits on its command line and its blocks in its start-up log. A
server already running says its blocks and block size in /metrics (`vllm:cache_config_info`) and, where the
user gives its start-up log, its KV memory and the limits it was started with; a probe run on a Polyaxon
service keeps both in its record (capacity.json, engine.json). A fact nothing states stays unknown, and
the prediction line says so instead of assuming vLLM's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.errors import HarnessError
from harness.inventory.frozen import Inventory
from harness.launch.engine_process import RunningEngine
from harness.launch.experiment import engine_limits
from harness.observe.capacity_report import CapacityReport
from harness.observe.device import device_facts
from harness.observe.server_logs import StartupCapacity, parse_startup_log
from harness.observe.server_metrics import fetch_metrics_text, label_count, parse_metrics
from harness.predict.population import KneePrediction, predict_knee
from harness.schema import EngineRecord, RunFile
from harness.search.answer import EngineFacts
from harness.search.probe import Knob
from harness.server_url import checked_server_url

# A knee is a population of requests in flight; the rate that keeps it there depends on how long each request
# stays, which only a measurement shows. So a rate search bisects its range and the knee is only reported.
RATE_NOT_BRACKETED = "; a rate search is not bracketed by it: its rates are bisected from the middle of the range"


class NoCapacityLogged(HarnessError):
    """The engine started but states no blocks: a configuration the search cannot bracket or answer."""


class Sizing(BaseModel):
    """What the search knows besides the engine: the inventory's requests, and a max_num_seqs the user gives
    for a server whose log does not state it."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    inventory: Inventory
    max_tokens: int | None = None
    max_num_seqs: int | None = None


def output_tokens(inventory: Inventory, max_tokens: int | None) -> list[int]:
    """Each request's output at its largest: its output cap (--max-tokens when given)."""
    return [max_tokens or prompt.output_cap_tokens for prompt in inventory.prompts]


def stated_facts(log: StartupCapacity | None, cache_config: dict[str, str] | None, limits: dict[str, Any],
                 sizing: Sizing, where: str) -> EngineFacts:
    """The facts from a start-up log, /metrics' cache config and the limits the engine was given, in that
    order of trust for blocks; `where` names the sources in a refusal."""
    cache_config = cache_config or {}
    block_size = _whole(limits.get("block_size")) or _whole(cache_config.get("block_size"))
    if not block_size and log is not None and log.num_gpu_blocks and log.kv_cache_tokens:
        block_size = log.kv_cache_tokens // log.num_gpu_blocks
    blocks = (log.num_gpu_blocks if log is not None else None) or _whole(cache_config.get("num_gpu_blocks"))
    # The CPU engine logs its cache in tokens only: whole blocks of the block size it was given.
    if not blocks and block_size and log is not None and log.kv_cache_tokens:
        blocks = log.kv_cache_tokens // block_size
    if not blocks or not block_size:
        raise NoCapacityLogged(f"{where}: states neither the engine's KV blocks and block size (num_gpu_blocks, "
                           "block_size) nor its KV cache's tokens; the search needs its capacity")
    return EngineFacts(num_gpu_blocks=blocks, block_size=block_size,
                       max_num_seqs=_max_num_seqs(limits, sizing.max_num_seqs, where),
                       kv_cache_bytes=kv_bytes(log, cache_config),
                       prompt_tokens=[prompt.prompt_tokens for prompt in sizing.inventory.prompts],
                       output_tokens=output_tokens(sizing.inventory, sizing.max_tokens),
                       conversation_ids=[prompt.conversation_id for prompt in sizing.inventory.prompts])


def kv_bytes(log: StartupCapacity | None, cache_config: dict[str, str]) -> int | None:
    """The KV memory the blocks were cut from: as logged, else as /metrics states a reservation given."""
    logged = (log.kv_cache_memory_bytes or log.available_kv_cache_bytes) if log is not None else None
    return logged or _whole(cache_config.get("kv_cache_memory_bytes"))


def _whole(value: Any) -> int | None:
    """A positive whole number from a limit (128, or 128.0 as the Polyaxon API may hand a number back) or a
    label ('128'), else None."""
    if isinstance(value, str):
        value = label_count(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _max_num_seqs(limits: dict[str, Any], given: int | None, where: str) -> int | None:
    stated = _whole(limits.get("max_num_seqs"))
    if stated is not None and given is not None and stated != given:
        raise HarnessError(f"--max-num-seqs {given}: {where} says the engine runs with max_num_seqs {stated}")
    return stated or given


def engine_facts(engine: RunningEngine, sizing: Sizing) -> EngineFacts:
    """An engine started here: its logged blocks, the limits on its command line and this machine's GPU."""
    log = parse_startup_log(engine.log_path.read_text(encoding="utf-8", errors="replace"))
    limits = engine_limits(engine.argv)
    facts = stated_facts(log, None, limits, sizing, str(engine.log_path))
    device = device_facts()
    return facts.model_copy(update={
        "gpu_memory_total_bytes": device.gpu_memory_total_bytes,
        "gpu_memory_utilization": limits.get("gpu_memory_utilization") if device.gpu_name else None})


def server_facts(base_url: str, log_text: str | None, sizing: Sizing) -> EngineFacts:
    """A server already running: /metrics' cache config, and its start-up log where one is given. Its GPU
    is not this machine's, so its memory total stays unknown."""
    checked_server_url(base_url, "--base-url")
    snapshot = parse_metrics(fetch_metrics_text(f"{base_url.rstrip('/')}/metrics"))
    log = parse_startup_log(log_text) if log_text else None
    limits = (log.non_default_args or {}) if log is not None else {}
    where = f"{base_url}/metrics" + (" and the start-up log" if log is not None else "")
    return stated_facts(log, snapshot.cache_config, limits, sizing, where)


def record_facts(run_dir: Path, sizing: Sizing) -> EngineFacts:
    """A probe's record (a harness job against a service): capacity.json and the limits in engine.json."""
    capacity, engine = run_dir / RunFile.CAPACITY, run_dir / RunFile.ENGINE
    if not capacity.exists():
        raise HarnessError(f"{run_dir}: the probe's record has no {RunFile.CAPACITY} (the service's start-up "
                           "log and /metrics); the search needs the engine's capacity")
    report = CapacityReport.model_validate_json(capacity.read_text(encoding="utf-8"))
    limits = EngineRecord.model_validate_json(engine.read_text(encoding="utf-8")).limits if engine.exists() else {}
    return stated_facts(report.log, report.metrics_cache_config, limits, sizing, str(capacity))


def predicted_knee(engine: EngineFacts, largest_concurrency: int) -> KneePrediction:
    """The knee from the inventory's lengths and the engine's usable blocks (vLLM keeps one as its null block)."""
    return predict_knee(engine.prompt_tokens, engine.output_tokens, block_size=engine.block_size,
                        usable_blocks=engine.num_gpu_blocks - 1, max_num_seqs=engine.max_num_seqs,
                        largest_concurrency=largest_concurrency, conversation_ids=engine.conversation_ids)


def prediction_line(point: dict[str, Any], prediction: KneePrediction, facts: EngineFacts, knob: Knob) -> str:
    where = ", ".join(f"{name}={value}" for name, value in point.items())
    knee = "no limit binds in the range" if prediction.knee_concurrency is None else (
        f"knee at concurrency {prediction.knee_concurrency} ({prediction.bound_by.value})")
    seqs = (f"max_num_seqs {facts.max_num_seqs}" if facts.max_num_seqs is not None else
            "max_num_seqs unknown (nothing the server gave states it; --max-num-seqs says it), so only the KV "
            "cache is predicted")
    kv_memory = "" if facts.kv_cache_bytes else (
        "; KV bytes unknown (neither a start-up log nor /metrics states them), so no KV memory remedy")
    preempts = "" if prediction.preemption_knee_concurrency is None else (
        f", preemption from {prediction.preemption_knee_concurrency}")
    return (f"{where + ': ' if where else ''}predicted {knee}: {facts.num_gpu_blocks - 1} usable blocks of "
            f"{facts.block_size}, {seqs}; all requests fit at their largest up to concurrency "
            f"{prediction.always_fits_up_to_concurrency}{preempts}{kv_memory}"
            + (RATE_NOT_BRACKETED if knob == Knob.RATE else ""))
