"""`harness search --project`: the service and the probes as runs on a real Polyaxon API (haupt sandbox).

The sandbox stores, compiles and schedules runs but has no agent, so nothing executes there. The test plays
the cluster's part, as tests/search/test_polyaxon_probes.py does: the service run is marked running, and each
probe's harness job leaves a record (written by the harness's own writer) under its `outputs/run` and ends
succeeded. Its records are those of the demo's engine: 4 MiB of KV = 32 blocks of 128 tokens (the start-up
log kv4m-len1024.log), max_num_seqs 8; the inventory's requests are 600 + 300 tokens = 8 blocks each.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.loopback import free_port
from harness.measure.figures import read_run_figures
from harness.polyaxon_client import polyaxon_call

from conftest import HARNESS, create_project
from run_records import STARVED_LOG, write_run

ROOT = Path(__file__).resolve().parents[2]
FILES = ["-f", str(ROOT / "polyaxonfiles" / "vllm-service.yaml"),
         "-f", str(ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"),
         "--harness", str(ROOT / "polyaxonfiles" / "harness-job.yaml"), "-P", "model=models/tiny"]
INVENTORY = str(ROOT / "prompts" / "tiny-qwen3-600x8")
SEARCH = ["--inventory", INVENTORY, "--high", "6", "--slo-ttft-ms-p99", "400"]
# generous: on a busy machine the played cluster has taken a probe only after 60 s in the queue
DEADLINES = ["--running-deadline-s", "180", "--harness-deadline-s", "180"]
WAITING = {"created", "compiled", "queued", "scheduled"}  # a run no agent has taken: the sandbox's are all
CAPACITY = 4  # the played engine's requests take 50 ms to a first token up to 4 in flight, 900 ms beyond


class Cluster:
    """What an agent, the service and the harness jobs would do: the service running, each probe's record."""

    def __init__(self, project: str, records: Path) -> None:
        from polyaxon.client import RunClient

        self.project, self.records = project, records
        self.client = RunClient(owner="default", project=project)
        self.played: set[str] = set()
        self.done = threading.Event()
        self.failures: list[str] = []

    def play(self) -> None:
        try:
            while not self.done.is_set():
                for run in polyaxon_call("list", lambda: self.client.list(limit=100).results):
                    if run.uuid in self.played or str(run.status) not in WAITING:
                        continue
                    self.played.add(run.uuid)
                    if run.kind == "service":
                        self._serve(run)
                    elif "-step-" in run.name:  # a probe; the search's own run is the search's to end
                        self._probe(run)
                time.sleep(0.3)
        except Exception as error:  # the search waits on its deadlines; the test says why
            self.failures.append(f"{type(error).__name__}: {error}")

    def _run(self, run_uuid: str) -> Any:
        from polyaxon.client import RunClient

        return RunClient(owner="default", project=self.project, run_uuid=run_uuid)

    def _serve(self, run: Any) -> None:
        polyaxon_call("running", self._run(run.uuid).start)

    def _probe(self, run: Any) -> None:
        """The harness job: its record at the load it was given, uploaded; its outputs; succeeded."""
        concurrency = run.inputs["concurrency"]
        record = write_run(self.records / run.uuid, concurrency=concurrency, requests=run.inputs["requests"],
                           ttft_ms=50.0 if concurrency <= CAPACITY else 900.0, log=STARVED_LOG,
                           limits={"max_num_seqs": 8})
        job = self._run(run.uuid)
        polyaxon_call("upload", lambda: job.upload_artifacts_dir(str(record), path="outputs/run",
                                                                 relative_to=str(record)))
        polyaxon_call("outputs", lambda: job.log_outputs(**read_run_figures(record).outputs(), async_req=False))
        polyaxon_call("succeeded", job.log_succeeded)


def project_runs(project: str) -> list[Any]:
    from polyaxon.client import RunClient

    runs = RunClient(owner="default", project=project).list(limit=100).results
    return sorted(runs, key=lambda run: run.created_at)


@pytest.mark.sandbox
def test_the_api_search_starts_the_service_probes_it_in_order_and_reads_the_answer_back(
        polyaxon_api: str, tmp_path: Path) -> None:
    from polyaxon.client import RunClient

    create_project("search-api")
    cluster = Cluster("search-api", tmp_path / "played")
    player = threading.Thread(target=cluster.play)
    player.start()
    try:
        # a process of its own, as a user runs it: Polyaxon's client keeps state per process
        result = subprocess.run([HARNESS, "search", *FILES, *SEARCH, "--project", "default/search-api",
                                 *DEADLINES, "--out", str(tmp_path / "search")], capture_output=True, text=True,
                                timeout=600)
    finally:
        cluster.done.set()
        player.join()
    assert cluster.failures == []
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    runs = project_runs("search-api")
    service, *probes, tracked = runs
    assert service.kind == "service" and service.inputs["model"] == "models/tiny"
    # the lowest load first, its record giving the capacity: 31 usable blocks, and arrivals of 600-token
    # prompts among requests part-way through their 300 output tokens wait from 6 (harness/predict/queueing.py);
    # then 5 (fails: the played engine slows beyond 4), so 6 is not measured; the bisection's 3 and 4 meet
    assert "predicted knee at concurrency 6 (kv_cache): 31 usable blocks of 128, max_num_seqs 8" in result.stderr
    assert [probe.inputs["concurrency"] for probe in probes] == [1, 5, 3, 4]
    search_id = probes[0].name.split("-")[1]
    for step, probe in enumerate(probes, start=1):
        assert probe.name == f"search-{search_id}-step-{step}-repeat-1"
        assert {f"search-{search_id}", f"search-step-{step}", "search-repeat-1"} <= set(probe.tags)
        assert probe.inputs["service_uuid"] == service.uuid  # every probe against the service started
        # differing in the load (and how many requests it sends: 3 × the requests in flight, at least 8)
        assert probe.inputs["requests"] == max(8, 3 * probe.inputs["concurrency"])
        assert {k: v for k, v in probe.inputs.items() if k not in ("concurrency", "requests", "warmup")} == {
            k: v for k, v in probes[0].inputs.items() if k not in ("concurrency", "requests", "warmup")}
    assert "max concurrency meeting p99 TTFT ≤ 400 ms: 4; at 5 p99 is 900 ms" in result.stdout, result.stdout
    # the search is a run in the project, its outputs the answer; the service is stopped at the end
    assert tracked.name == f"search-{search_id}"
    assert tracked.outputs["capacity_concurrency"] == 4 and tracked.outputs["predicted_knee_concurrency"] == 6
    stopped = RunClient(owner="default", project="search-api", run_uuid=service.uuid)
    deadline = time.monotonic() + 30  # the API applies a stop asynchronously
    while str(stopped.run_data.status) not in {"stopping", "stopped"} and time.monotonic() < deadline:
        time.sleep(0.5)
        stopped.refresh_data()
    assert str(stopped.run_data.status) in {"stopping", "stopped"}


def test_an_unreachable_api_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from polyaxon import settings

    monkeypatch.setattr(settings.CLIENT_CONFIG, "host", f"http://127.0.0.1:{free_port()}")
    result = CliRunner().invoke(app, ["search", *FILES, *SEARCH, "--project", "default/search-api",
                                      "--out", str(tmp_path / "search")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: cannot create run 'vllm-") and "default/search-api" in lines[0], lines[0]
