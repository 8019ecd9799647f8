"""The demo end to end on the real CPU engine: the README's sweep, through the local executor, analysed.

One sweep (max_num_seqs 1, 2, 4, 8 against 8 requests in flight of 600 + 300 tokens for 12 s, a 4,096-token
KV cache) is run once for the module; each test reads what it must show from the records, the report and
Polyaxon.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from polyaxon.client import RunClient
from rich.console import Console

from harness.dev.demo import CONCURRENCY, INVENTORY, DemoResult, run_demo
from harness.inventory.frozen import load_inventory
from harness.measure.record import read_requests, read_samples
from harness.model_identity import read_identity
from harness.predict.model_shape import PINNED_REVISION

from conftest import create_project, polyaxon_cli

pytestmark = pytest.mark.engine
POLYAXON = str(Path(sys.executable).with_name("polyaxon"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[DemoResult, str]:
    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    result = run_demo(out, Console(file=printed, width=160))
    return result, printed.getvalue()


@pytest.fixture(scope="module")
def records(demo: tuple[DemoResult, str]) -> dict[int, Path]:
    """Each point's run record, by its max_num_seqs."""
    result, _ = demo
    found = {}
    for engine_json in Path(result.points_dir).glob("point-*/run/engine.json"):
        found[json.loads(engine_json.read_text())["limits"]["max_num_seqs"]] = engine_json.parent
    return found


def outputs(run_dir: Path) -> tuple[str, dict]:
    uuid = json.loads((run_dir / "tracking.json").read_text())["run_uuid"]
    return uuid, json.loads((run_dir.parents[2] / "polyaxon" / "runs" / uuid / "run.plx.json").read_text())["outputs"]


def mean_queue_time_s(run_dir: Path) -> float:
    """vllm:request_queue_time_seconds over the run (each point's engine is fresh, so cumulative = this run)."""
    queue = [s.snapshot for s in read_samples(run_dir) if s.snapshot is not None][-1].request_queue_time_seconds
    assert queue is not None, "the engine exported no queue-time histogram"
    return queue.sum / queue.count


def test_every_point_ran_and_predicted_capacity_equals_logged(demo, records) -> None:
    result, _ = demo
    assert result.failed_points == []
    assert sorted(records) == [1, 2, 4, 8]
    for run_dir in records.values():
        capacity = json.loads((run_dir / "capacity.json").read_text())
        assert capacity["prediction_matches_log"] is True
        assert capacity["prediction"]["kv_cache_tokens"] == capacity["log"]["kv_cache_tokens"] == 4096
        assert capacity["prediction"]["max_concurrency"] == capacity["log"]["max_concurrency"]
        assert capacity["disagreements"] == []


def test_every_request_is_accounted_for(records) -> None:
    inventory = load_inventory(INVENTORY)
    for run_dir in records.values():
        requests = read_requests(run_dir)
        assert len(requests) >= len(inventory.prompts) == 8  # 12 s of load: at least the first 8 in flight
        assert all(r.error_class is None for r in requests)
        assert {r.prompt_tokens for r in requests} == {p.prompt_tokens for p in inventory.prompts}
        assert all(r.output_tokens == 300 for r in requests)
        assert pd.read_parquet(run_dir / "requests.parquet").shape[0] == len(requests)
        summary = json.loads((run_dir / "summary.json").read_text())
        # the engine's histograms counted exactly the requests the client saw finish, none from before
        assert summary["engine"]["engine_requests_finished"] == len(requests)
        assert summary["server"]["prefix_cache_hits_during_run_tokens"] == 0  # prefix caching off: measured fresh


def test_waiting_exactly_when_concurrency_exceeds_max_num_seqs_and_preemption_only_when_capacity_bound(
    demo, records
) -> None:
    result, _ = demo
    verdicts = {}
    for line in Path(result.report_markdown).read_text().splitlines():
        for max_num_seqs, run_dir in records.items():
            uuid, _ = outputs(run_dir)
            if line.startswith(f"| {uuid} |") and ("capacity" in line or "scheduling" in line):
                verdicts[max_num_seqs] = line
    for max_num_seqs, run_dir in records.items():
        _, figures = outputs(run_dir)
        if max_num_seqs < CONCURRENCY:  # requests queued for a slot: the engine's own queue-time histogram says
            assert mean_queue_time_s(run_dir) > 0.1  # so whether or not a /metrics sample caught the queue
        if figures["preemptions_during_run"] > 0:
            assert "KV cache capacity" in verdicts[max_num_seqs]
        if figures["peak_waiting_requests"] > 0 and max_num_seqs >= CONCURRENCY:
            # nothing waits for a sequence slot here: whatever waited, waited for KV blocks
            assert figures["preemptions_during_run"] > 0 or figures["peak_kv_cache_usage_fraction"] >= 0.9
    # 1 or 2 running sequences hold at most 2 x 8 blocks of 128 = 2,048 tokens of the 31 usable blocks' 3,968:
    # the queue is max_num_seqs'
    assert "max_num_seqs (scheduling)" in verdicts[1] and "max_num_seqs (scheduling)" in verdicts[2]
    # 4 running take 4 x ceil(900 / 128) = 32 blocks > 31 usable, although 4 x 900 = 3,600 raw tokens would fit
    assert "KV cache capacity" in verdicts[4] and "kv_tokens_needed_padded=4096" in verdicts[4]
    # all 8 running would need 8 x 8 blocks: the cache binds
    assert "KV cache capacity" in verdicts[8] and outputs(records[8])[1]["preemptions_during_run"] > 0
    # one seat: on average about 7 of the 8 wait, and never more than one runs (vLLM's histograms, no sampling)
    _, capped = outputs(records[1])
    assert capped["engine_waiting_requests_mean"] > 3 and capped["engine_running_requests_mean"] <= 1.02


def test_report_and_summary_trace_every_point_to_its_run_uuid(demo, records) -> None:
    result, printed = demo
    markdown = Path(result.report_markdown).read_text()
    html = Path(result.report_html).read_text()
    for run_dir in records.values():
        uuid, _ = outputs(run_dir)
        assert uuid in markdown and uuid in html
        assert uuid[:8] in printed
    assert "data:image/png;base64," in html
    assert "KV tokens pred / log" in printed and "4,096 / 4,096" in printed
    assert "front ms" in printed and "queue ms" in printed  # where the time went, per point


def test_every_point_names_the_tiny_model_by_its_own_identity_and_never_by_qwen3_4bs_revision(
    demo, records, tiny_model_dir
) -> None:
    """The sweep's spec defaults to Qwen3-4B's pinned revision; the generated model has none of its own."""
    result, _ = demo
    identity = read_identity(tiny_model_dir)
    assert identity is not None
    for run_dir in records.values():
        engine = json.loads((run_dir / "engine.json").read_text())
        assert engine["limits"] | identity.limits() == engine["limits"] and "revision" not in engine["limits"]
        assert PINNED_REVISION not in (run_dir / "engine.json").read_text() + (run_dir / "engine.log").read_text()
        uuid, _ = outputs(run_dir)
        tracked = json.loads((run_dir.parents[2] / "polyaxon" / "runs" / uuid / "run.plx.json").read_text())["inputs"]
        assert tracked["model_files_sha256"] == identity.files_sha256 and "revision" not in tracked
    markdown = Path(result.report_markdown).read_text()
    held = markdown.split("## Held fixed")[1].split("## ")[0]
    assert f"| model_files_sha256 | {identity.files_sha256} |" in held and "| model_seed | 0 |" in held
    assert "revision" not in held and PINNED_REVISION not in markdown + Path(result.report_html).read_text()


def test_no_burst_delivered_run_shows_per_token_figures(records) -> None:
    for run_dir in records.values():
        _, figures = outputs(run_dir)
        if figures["per_token_latency_paced"] is False:
            assert "tpot_ms_p50" not in figures and "itl_ms_p50" not in figures
            assert "not per-token figures" in figures["qualifications"]
        else:
            assert figures["burst_token_fraction"] <= 0.1 and "tpot_ms_p50" in figures


@pytest.mark.sandbox
def test_offline_runs_are_listed_pushed_and_read_back_with_the_same_figures(demo, records, polyaxon_api) -> None:
    result, _ = demo
    listed = subprocess.run([POLYAXON, "ops", "ls", "--offline", "--path", result.offline_root, "-io"],
                            capture_output=True, text=True, timeout=60)
    uuids = {outputs(run_dir)[0]: outputs(run_dir)[1] for run_dir in records.values()}
    assert all(uuid in listed.stdout for uuid in uuids)
    create_project("vllm-harness-demo")
    pushed = polyaxon_cli("ops", "push", "-p", "vllm-harness-demo", "--path", result.offline_root, "-a")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    for uuid, figures in uuids.items():
        client = RunClient(owner="default", project="vllm-harness-demo", run_uuid=uuid)
        client.refresh_data()
        remote = client.get_outputs()
        for name in ("ttft_ms_p99", "kv_cache_tokens_logged", "kv_cache_tokens_predicted", "preemptions_during_run"):
            assert remote[name] == pytest.approx(figures[name])


def test_the_demo_ends_with_a_search_that_finds_the_kv_knee_in_at_most_seven_probes(demo) -> None:
    result, printed = demo
    # concurrency 1-6 at max_num_seqs 8: arrivals predicted to wait from 6 (5 requests part-way through their
    # outputs hold about 31.6 blocks, and an arrival's 600-token prompt needs 5 more, of 31 usable), probed
    # first with 5. That first step sits at the cache's edge: where the engine preempts there, its interval
    # straddles the objective and the search measures it again, up to 3 runs (SearchPlan.max_repeats): five
    # steps with that one measured three times are 5 + 2 probes.
    assert result.search_probes <= 7
    # the limit is six of the sweep's quickest mean prefills (vLLM's histograms), in whole 50 ms
    assert re.match(r"max concurrency meeting p99 TTFT ≤ [\d,]*[05]0 ms: ", result.search_answer[0])
    assert result.search_answer[1].startswith("the knee: KV cache capacity: ")
    assert "predicted knee concurrency 6 (kv_cache)" in result.search_answer[-1]
    assert Path(result.search_markdown).exists() and "max concurrency meeting" in printed
