"""The search's probes as ordinary runs on a real Polyaxon API (haupt sandbox), and CE's own grid fallback.

The sandbox stores, compiles and schedules runs but has no agent: a probe's run never executes there. So
these tests check what the API shows of the probes (the runs created, their tags, inputs and compiled
commands, fresh on resubmission), and drive the read-back path by playing the job themselves: a real
record (written by the harness's own writer) is uploaded under the run's `outputs/run`, its outputs logged
and the run marked succeeded through Polyaxon's client, which is what the harness job and its sidecar do
on a cluster.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from analysis.sources import read_run_directory
from harness.launch.specs import check_files, load_operation
from harness.measure.figures import read_run_figures
from harness.polyaxon_client import polyaxon_call
from harness.schema import RunFile
from harness.search.polyaxon_probes import PolyaxonProbeRunner, probe_name, probe_params
from harness.search.probe import Knob, Probe

from conftest import create_project
from run_records import write_run

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = [ROOT / "polyaxonfiles" / "experiment.yaml", ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"]
SEARCH_GRID = ROOT / "polyaxonfiles" / "search-grid.yaml"
SEARCH_PARAMS = {"model": "models/tiny", "allow_unauthenticated": True, "concurrency": 99}  # 99: the probe's wins


def probe(step: int, value: float, **fields: object) -> Probe:
    return Probe(search_id="s1", step=step, repeat=1, knob=Knob.CONCURRENCY, value=value, **fields)


def project_runs(project: str, expected: int, deadline_s: float = 60) -> list:
    """The project's job runs, oldest first, once `expected` exist and the API has compiled each one."""
    from polyaxon.client import RunClient

    client = RunClient(owner="default", project=project)
    deadline = time.monotonic() + deadline_s
    while True:
        jobs = [run for run in client.list(limit=100).results if run.kind == "job"]
        if (len(jobs) >= expected and all(str(job.status) != "created" for job in jobs)) or time.monotonic() > deadline:
            return sorted(jobs, key=lambda run: run.created_at)
        time.sleep(0.5)


def test_a_probe_sends_its_load_and_its_size_as_values_of_the_experiments_inputs() -> None:
    assert probe_params(probe(1, 6)) == {"concurrency": 6}
    assert probe_params(probe(2, 6, requests=24, warmup_requests=6)) == {"concurrency": 6, "requests": 24, "warmup": 6}
    rate = Probe(search_id="s1", step=1, repeat=2, knob=Knob.RATE, value=1.5, max_concurrency=16)
    assert probe_params(rate) == {"rate": 1.5, "max_concurrency": 16}
    assert probe_name(rate) == "search-s1-step-1-repeat-2"
    for params in (probe_params(probe(2, 6, requests=24, warmup_requests=6)), probe_params(rate)):
        load_operation(EXPERIMENT, {**SEARCH_PARAMS, "concurrency": None, **params})  # every value an input


@pytest.mark.sandbox
def test_a_searchs_probes_are_runs_created_in_order_tagged_and_differing_only_in_the_load(
        polyaxon_api: str, tmp_path: Path) -> None:
    from polyaxon.client import RunClient

    project = create_project("search-probes")
    runner = PolyaxonProbeRunner(project, EXPERIMENT, SEARCH_PARAMS, out=tmp_path, deadline_s=60, poll_s=0.2)
    probes = [probe(1, 4), probe(2, 8), probe(3, 6)]  # the order a bisection over 1..8 bracketed at 4 measures
    submitted = [runner.submit(each) for each in probes]
    runs = project_runs("search-probes", len(probes))
    assert [run.uuid for run in runs] == submitted
    assert [run.tags for run in runs] == [each.tags() for each in probes]
    assert [run.inputs["concurrency"] for run in runs] == [4, 8, 6]
    differing = {name for run in runs[1:] for name, value in run.inputs.items() if runs[0].inputs[name] != value}
    assert differing == {"concurrency"}  # every limit of the server, and the rest of the workload, held fixed
    for run, each in zip(runs, probes, strict=True):
        compiled = RunClient(owner="default", project="search-probes", run_uuid=run.uuid)
        compiled.refresh_data()
        args = json.loads(compiled.run_data.content)["run"]["container"]["args"]
        assert [word for word in args if word.startswith("--concurrency")] == [f"--concurrency={each.value:g}"]

    again = [runner.submit(each) for each in probes]  # the same search resubmitted
    runs = project_runs("search-probes", 2 * len(probes))
    assert [run.uuid for run in runs[len(probes):]] == again and not set(again) & set(submitted)
    for run in runs[len(probes):]:
        data = RunClient(owner="default", project="search-probes", run_uuid=run.uuid)
        data.refresh_data()
        # measured again: compiled and waiting for an agent, not a cache hit copying the first search's run
        assert data.run_data.pending != "cache" and not data.run_data.original
        assert str(data.run_data.status) in {"compiled", "queued"}


def play_the_job(project: str, name: str, record: Path) -> None:
    """What the harness job and its sidecar do on a cluster: the record under the run's outputs, its
    outputs logged, the run ended succeeded."""
    from polyaxon.client import RunClient

    client = RunClient(owner="default", project=project)
    deadline = time.monotonic() + 60
    while not (found := [run for run in client.list(limit=100).results if run.name == name]):
        assert time.monotonic() < deadline, f"no run named {name}"
        time.sleep(0.2)
    run = RunClient(owner="default", project=project, run_uuid=found[0].uuid)
    polyaxon_call("upload", lambda: run.upload_artifacts_dir(str(record), path="outputs/run", relative_to=str(record)))
    polyaxon_call("outputs", lambda: run.log_outputs(**read_run_figures(record).outputs(), async_req=False))
    while str(run.run_data.status) != "succeeded":
        assert time.monotonic() < deadline, f"run {run.run_uuid} never took 'succeeded'"
        polyaxon_call("succeeded", run.log_succeeded)
        time.sleep(0.5)
        polyaxon_call("status", run.refresh_data)


@pytest.mark.sandbox
def test_a_probes_record_is_read_back_through_the_api_into_a_run_directory(polyaxon_api: str, tmp_path: Path) -> None:
    project = create_project("search-read-back")
    # the job's record: 8 requests at concurrency 6, each TTFT 50 ms (run_records.write_run)
    record = write_run(tmp_path / "job", concurrency=6, ttft_ms=50.0)
    sized = probe(1, 6, requests=8, warmup_requests=6)
    runner = PolyaxonProbeRunner(project, EXPERIMENT, SEARCH_PARAMS, out=tmp_path / "search", deadline_s=90, poll_s=0.2)
    job = threading.Thread(target=play_the_job, args=("search-read-back", probe_name(sized), record))
    job.start()
    try:
        run_dir = runner.run(sized)
    finally:
        job.join()
    [run] = project_runs("search-read-back", 1)
    assert run_dir == tmp_path / "search" / "search-s1-step-1-repeat-1"
    assert run.inputs["requests"] == 8 and run.inputs["warmup"] == 6
    read = read_run_directory(run_dir)
    assert read.run_uuid == run.uuid  # joined on the Polyaxon run, not the record's own id
    assert read.outputs["ttft_ms_p99"] == pytest.approx(50.0)
    assert (run_dir / RunFile.REQUESTS).read_bytes() == (record / RunFile.REQUESTS).read_bytes()


def test_the_ce_grid_fallback_is_an_ascending_grid_one_point_at_a_time_stopping_on_slo_met() -> None:
    spec = yaml.safe_load(SEARCH_GRID.read_text(encoding="utf-8"))
    matrix = load_operation([SEARCH_GRID], {"slo_ttft_ms": 2000, "slo_target_share": 0.99}).matrix
    assert matrix.kind == "grid" and matrix.concurrency == 1
    values = spec["matrix"]["params"]["concurrency"]["value"]
    assert values == sorted(values) and len(values) == len(set(values)) >= 5
    [stopping] = matrix.early_stopping
    assert (stopping.kind, stopping.metric, stopping.value, str(stopping.optimization)) == (
        "metric_early_stopping", "slo_met", 0, "minimize")
    points = check_files([SEARCH_GRID], {"slo_ttft_ms": "2000", "slo_target_share": "0.99"})  # each compiled
    assert [point["concurrency"] for point in points] == values
    outputs = {entry["name"]: entry["type"] for entry in yaml.safe_load(EXPERIMENT[0].read_text())["outputs"]}
    assert outputs["slo_met"] == "int"  # what the harness job gives (tests/measure/test_stats.py)


@pytest.mark.sandbox
def test_the_sandbox_expands_the_grid_in_order_and_stops_it_at_the_first_point_missing_its_objective(
        polyaxon_api: str) -> None:
    from polyaxon.client import RunClient

    create_project("search-grid")
    operation = load_operation([SEARCH_GRID], {"slo_ttft_ms": 2000, "slo_target_share": 0.99})
    values = [point["concurrency"] for point in check_files([SEARCH_GRID], {"slo_ttft_ms": 2000,
                                                                            "slo_target_share": 0.99})]
    RunClient(owner="default", project="search-grid").create(name="search-grid", content=operation)
    children = project_runs("search-grid", len(values))
    assert [child.inputs["concurrency"] for child in children] == values  # created in the order written
    assert {str(child.status) for child in children} == {"compiled"}  # none runs: the sandbox has no agent

    def ends(index: int, slo_met: int) -> list[str]:
        run = RunClient(owner="default", project="search-grid", run_uuid=children[index].uuid)
        polyaxon_call("outputs", lambda: run.log_outputs(slo_met=slo_met, async_req=False))
        polyaxon_call("succeeded", run.log_succeeded)
        time.sleep(5)  # the scheduler checks early stopping when a child's status changes
        return [str(child.status) for child in project_runs("search-grid", len(values))]

    assert ends(0, slo_met=1)[1:] == ["compiled"] * (len(values) - 1)  # met: the grid goes on
    statuses = ends(1, slo_met=0)  # missed at the second point: the rest never run
    assert statuses[1] == "succeeded" and set(statuses[2:]) == {"stopped"}
