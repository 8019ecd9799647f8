"""What a Polyaxon CE user meets on a cluster, against a real Polyaxon API (haupt sandbox, which compiles and
expands runs but never executes them): fresh sweeps, named points, the report's joins."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from polyaxon.client import ProjectClient, RunClient

from harness.specs import render

ROOT = Path(__file__).resolve().parents[1]
POLYAXON = str(Path(sys.executable).with_name("polyaxon"))
SWEEP = ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml"


def submit(project: str, *args: str) -> None:
    created = subprocess.run([POLYAXON, "run", "-p", project, *args], capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stdout + created.stderr


def children(project: str, expected: int, deadline_s: float = 90) -> list:
    """The job runs of a project once the API has expanded at least `expected` of them."""
    client = RunClient(owner="default", project=project)
    deadline = time.monotonic() + deadline_s
    while True:
        jobs = [run for run in client.list(limit=100).results if run.kind == "job"]
        if len(jobs) >= expected or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


@pytest.mark.sandbox
def test_a_resubmitted_sweep_is_measured_again_not_served_from_the_cache(polyaxon_api: str):
    ProjectClient(owner="default").create({"name": "fresh-sweeps"})
    points = len(render([SWEEP], {"concurrency": 32}).matrix_points)  # 6 values of max_num_seqs
    submit("fresh-sweeps", "-f", str(SWEEP), "-P", "concurrency=32")
    children("fresh-sweeps", points)
    submit("fresh-sweeps", "-f", str(SWEEP), "-P", "concurrency=32")
    jobs = children("fresh-sweeps", 2 * points)
    time.sleep(5)  # a cache hit is decided after creation: give the API the time it took in the failing case
    jobs = children("fresh-sweeps", 2 * points)
    assert len(jobs) == 2 * points
    for job in jobs:
        run = RunClient(owner="default", project="fresh-sweeps", run_uuid=job.uuid)
        run.refresh_data()
        data = run.run_data
        assert data.pending != "cache", f"child {job.uuid} waits on the cache"
        assert str(data.status) != "succeeded", f"child {job.uuid} was answered from a cached run"
        assert not data.original, f"child {job.uuid} copies run {data.original}"
