"""The service + harness sweep driver end to end on the real CPU engine, with the same polyaxonfiles."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import invalid_only_because_busy

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
HARNESS = str(Path(sys.executable).with_name("harness"))


def test_each_point_starts_the_service_measures_it_and_stops_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """With a canary as the engines' key: every point is measured through it, and no file of the sweep or its
    report, nor what the commands print, holds it."""
    canary = f"canary-{secrets.token_hex(12)}"
    env = {**os.environ, "VLLM_API_KEY": canary}
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("kind: operation\n"
                     "matrix: {kind: mapping, concurrency: 1, values: [{max_num_seqs: 2}, {max_num_seqs: 8}]}\n"
                     f"pathRef: {ROOT / 'polyaxonfiles' / 'vllm-service.yaml'}\n")
    out = tmp_path / "out"
    done = subprocess.run(
        [HARNESS, "sweep", "--local", "-f", str(sweep),
         "--service", str(ROOT / "polyaxonfiles" / "vllm-service.yaml"),
         "--service", str(ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"),
         "--harness", str(ROOT / "polyaxonfiles" / "harness-job.yaml"),
         "-P", f"model={tiny_model_dir}", "-P", f"inventory={ROOT / 'prompts' / 'tiny-qwen3-600x8'}",
         "-P", "concurrency=8", "--out", str(out)], capture_output=True, text=True, timeout=900, env=env)
    result = json.loads((out / "sweep.json").read_text())
    # a point this machine kept the client from measuring is invalid, rightly, and the report says so
    busy = {point["params"]["max_num_seqs"] for point in result["points"] if point["outcome"] == "measured_invalid"
            and invalid_only_because_busy(Path(point["harness"]))}
    assert done.returncode == (3 if busy else 0), done.stderr[-2000:]
    assert [point["outcome"] for point in result["points"]] == [
        "measured_invalid" if limit in busy else "measured" for limit in (2, 8)]
    for point, max_num_seqs in zip(result["points"], (2, 8), strict=True):
        record = Path(point["harness"])
        inputs = json.loads((record / "config.json").read_text())
        assert inputs["service_uuid"] == point["service"]  # the harness run knows which service it measured
        assert json.loads((record / "engine.json").read_text())["limits"]["max_num_seqs"] == max_num_seqs
        capacity = json.loads((record / "capacity.json").read_text())
        assert capacity["prediction_matches_log"] is True and capacity["log"]["kv_cache_tokens"] == 4096
    engines = subprocess.run(["pgrep", "-f", "--", f"--model[= ]{tiny_model_dir}"], capture_output=True, text=True,
                             timeout=30)
    assert engines.returncode == 1 and engines.stdout.strip() == ""  # pgrep ran and found no service left

    report = subprocess.run([HARNESS, "report", "--runs", str(out), "--limit", "max_num_seqs", "--out",
                             str(tmp_path / "report")], capture_output=True, text=True, timeout=120, env=env)
    assert report.returncode == 0, report.stderr
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert {"engine.log", "engine.json", "config.json", "sweep.json", "report.md"} <= {path.name for path in files}
    assert [path for path in files if canary.encode() in path.read_bytes()] == []
    assert canary not in done.stdout + done.stderr + report.stdout + report.stderr
    verdicts = dict(line.split(": ", 1) for line in report.stdout.splitlines() if not line.startswith("report:"))
    runs = {json.loads((Path(p["harness"]) / "tracking.json").read_text())["run_uuid"]: p for p in result["points"]}
    by_limit = {runs[uuid]["params"]["max_num_seqs"]: verdict for uuid, verdict in verdicts.items()}
    expected = {2: "max_num_seqs (scheduling)", 8: "KV cache capacity"}
    assert by_limit == {limit: "measurement invalid (client)" if limit in busy else verdict
                        for limit, verdict in expected.items()}
