"""A report from real CPU-engine runs: the verdicts match what the sweep was built to show.

A two-point Polyaxon mapping sweep over the production experiment polyaxonfile (with the local-cpu
preset, run point by point by the local executor) varies only kv_cache_memory_bytes. Both run
max_num_seqs 2 under 8 requests in flight of 600 prompt + 300 output tokens (128-token blocks, 1,024 KV
bytes per token), so six requests queue for most of the run whatever bound it:

- 1,179,648 bytes = 9 blocks (8 usable: vLLM keeps one back): a sequence takes 5 blocks to start and 8 by
  its end, so the engine runs one at a time while the others wait for blocks: KV cache capacity.
- 64 MiB = 512 blocks: both allowed sequences fit many times over, the others wait for a seat:
  max_num_seqs (scheduling).

How many ran and waited comes from vLLM's own histograms (Little's law over the run), not from /metrics
scrapes, which on a busy 2-core machine may land on any moment or none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from analysis.diagnose import KV_CAPACITY, SCHEDULING
from analysis.report import write_report
from harness.launch.local_executor import run_locally

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO_ROOT / "polyaxonfiles" / "experiment.yaml"  # what every point of the sweep runs
LOCAL_CPU_PRESET = REPO_ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"
INVENTORY = REPO_ROOT / "prompts" / "tiny-qwen3-600x8"
STARVED_KV_BYTES = 9 * 128 * 1024
AMPLE_KV_BYTES = 64 * 1024 * 1024


@pytest.mark.engine
def test_report_on_a_real_kv_sweep_says_capacity_then_scheduling(tiny_model_dir: Path, tmp_path: Path) -> None:
    offline_root = tmp_path / "polyaxon"
    sweep = tmp_path / "sweep-kv.yaml"
    sweep.write_text(yaml.safe_dump({
        "kind": "operation", "name": "sweep-kv-cache-memory-bytes", "pathRef": str(EXPERIMENT),
        "matrix": {"kind": "mapping", "concurrency": 1,
                   "values": [{"kv_cache_memory_bytes": STARVED_KV_BYTES}, {"kv_cache_memory_bytes": AMPLE_KV_BYTES}]},
    }))
    runs = run_locally(
        [sweep, LOCAL_CPU_PRESET],
        {"model": str(tiny_model_dir), "inventory": str(INVENTORY), "concurrency": 8, "max_num_seqs": 2},
        out_root=tmp_path / "points",
        env={"HARNESS_OFFLINE_ROOT": str(offline_root), "HARNESS_PROJECT": "local/analysis-engine"},
    )
    assert [run.exit_code for run in runs] == [0, 0], [run.outputs_dir for run in runs]

    written = write_report(limit="kv_cache_memory_bytes", out=tmp_path / "report", run_dirs=[tmp_path / "points"])
    table = written.runs
    verdicts = {table.at[verdict.run_uuid, "kv_cache_memory_bytes"]: verdict for verdict in written.verdicts}
    starved, ample = verdicts[STARVED_KV_BYTES], verdicts[AMPLE_KV_BYTES]
    assert starved.bound_by == KV_CAPACITY, starved.text
    assert ample.bound_by == SCHEDULING, ample.text

    starved_row, ample_row = table.loc[starved.run_uuid], table.loc[ample.run_uuid]
    assert starved_row["kv_cache_tokens_logged"] == 9 * 128  # the engine's own count of what 9 blocks hold
    assert starved_row["kv_cache_tokens_predicted"] == starved_row["kv_cache_tokens_logged"]
    # one 8-block sequence at a time: the engine's prefill + decode spans never overlap, so their sum over the
    # run's window is at most 1 (a little less: the engine idles between one request's end and the next start)
    assert 0.5 < starved_row["engine_running_requests_mean"] <= 1.02
    assert starved_row["engine_waiting_requests_mean"] >= 0.5  # 7 of the 8 wait most of the run
    # 2 sequences of 600 + 300 tokens take ceil(900 / 128) = 8 blocks each: 2 x 8 x 128 = 2,048 > 8 x 128
    assert "kv_tokens_needed_padded=2048" in starved.evidence and "kv_cache_tokens_usable=1024" in starved.evidence
    # both seats busy nearly all the time, never more than max_num_seqs
    assert 1.5 < ample_row["engine_running_requests_mean"] <= 2.02
    assert ample_row["engine_waiting_requests_mean"] >= 0.5
    assert ample_row["peak_kv_cache_usage_fraction"] < 0.1  # 16 of 512 blocks at most
    assert "max_num_seqs=2" in ample.evidence and "concurrency=8" in ample.evidence

    markdown = written.markdown.read_text()
    for verdict in (starved, ample):
        limit_value = table.at[verdict.run_uuid, "kv_cache_memory_bytes"]
        assert f"| {verdict.run_uuid} | {limit_value} | {verdict.bound_by} |" in markdown
    # the same runs, tracked offline by the experiment, read back through Polyaxon's loaders
    offline = write_report(limit="kv_cache_memory_bytes", out=tmp_path / "offline-report", offline_root=offline_root)
    assert {v.run_uuid: v.bound_by for v in offline.verdicts} == {v.run_uuid: v.bound_by for v in written.verdicts}
