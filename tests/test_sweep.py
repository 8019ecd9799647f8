"""The service + harness sweep driver against a real Polyaxon API (haupt sandbox, which never runs anything)."""

from __future__ import annotations

from pathlib import Path

import pytest
from polyaxon.client import ProjectClient, RunClient

from harness.errors import HarnessError
from harness.sweep import Outcome, PolyaxonBackend, run_sweep, sweep_points

from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
SERVICE = [ROOT / "polyaxonfiles" / "vllm-service.yaml"]
HARNESS_JOB = [ROOT / "polyaxonfiles" / "harness-job.yaml"]


def sweep_file(tmp_path: Path, values: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "kind: operation\n"
        f"matrix:\n  kind: mapping\n  concurrency: 1\n  values: {values}\n"
        f"pathRef: {SERVICE[0]}\n"
    )
    return path


def backend(project: str, tmp_path: Path, deadline_s: float = 2.0) -> PolyaxonBackend:
    return PolyaxonBackend(project, SERVICE, HARNESS_JOB, {}, queue=None, running_deadline_s=deadline_s,
                           harness_deadline_s=10, logs_dir=tmp_path / "logs", poll_s=0.3)


def test_points_come_from_the_sweep_file_and_are_checked(tmp_path: Path):
    limit, points = sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: 8}]")], SERVICE, {})
    assert (limit, points) == ("max_num_seqs", [{"max_num_seqs": 4}, {"max_num_seqs": 8}])
    with pytest.raises(HarnessError, match=r"point 1 changes 'max_model_len' besides 'max_num_seqs'"):
        sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_model_len: 2048}]")], SERVICE, {})
    with pytest.raises(HarnessError, match=r"point 1 \{'max_num_seqs': 0\}.*max_num_seqs"):
        sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: 0}]")], SERVICE, {})
    with pytest.raises(HarnessError, match="max_num_seqs"):
        sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: eight}]")], SERVICE, {})


def test_a_service_not_running_by_the_deadline_is_recorded_stopped_and_the_sweep_goes_on(
    tmp_path: Path, polyaxon_api: str
):
    ProjectClient(owner="default").create({"name": "sweep-late"})
    limit, points = sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}, {max_num_seqs: 8}]")], SERVICE, {})
    result = run_sweep(tmp_path / "sweep.yaml", limit, points, backend("default/sweep-late", tmp_path))
    assert [point.outcome for point in result.points] == [Outcome.SERVICE_LATE, Outcome.SERVICE_LATE]
    for point, value in zip(result.points, (4, 8)):
        service = RunClient(owner="default", project="sweep-late", run_uuid=point.service)
        service.refresh_data()
        assert service.run_data.inputs["max_num_seqs"] == value
        assert str(service.run_data.status) in {"stopping", "stopped"}
        assert "not running" in point.detail
        assert (tmp_path / "logs" / f"point-{point.index}-{point.service}.log").exists()
    assert point.harness is None  # no harness job against a service that never ran


def test_unknown_project_and_unreachable_api_stop_the_sweep_with_one_line(tmp_path: Path, polyaxon_api: str,
                                                                          monkeypatch):
    limit, points = sweep_points([sweep_file(tmp_path, "[{max_num_seqs: 4}]")], SERVICE, {})
    with pytest.raises(HarnessError, match="default/no-such-project"):
        run_sweep(tmp_path / "sweep.yaml", limit, points, backend("default/no-such-project", tmp_path))
    from polyaxon import settings

    monkeypatch.setattr(settings.CLIENT_CONFIG, "host", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HarnessError, match="cannot create run"):
        run_sweep(tmp_path / "sweep.yaml", limit, points, backend("default/sweep-late", tmp_path))
