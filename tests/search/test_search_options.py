"""`harness search`'s load options refused before anything starts: one line naming the option, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("load", "says"), [
    (["--over", "rate", "--low", "0.5", "--high", "2", "--step", "0.5"],
     "error: --over rate needs --max-concurrency N: the cap on requests in flight"),
    (["--over", "concurrency", "--high", "4", "--max-concurrency", "4"],
     "error: --max-concurrency 4: only under --over rate; a closed loop's requests in flight are the concurrency "
     "searched"),
])
def test_an_open_loop_needs_its_cap_and_a_closed_loop_refuses_one(tmp_path: Path, load: list[str], says: str) -> None:
    done = CliRunner().invoke(app, [
        "search", "-f", str(ROOT / "polyaxonfiles" / "vllm-service.yaml"), "--inventory",
        str(ROOT / "prompts" / "tiny-qwen3-600x8"), "--slo-ttft-ms-p99", "400", "--out", str(tmp_path / "out"), *load])
    assert done.exit_code == 2, done.output
    assert done.output.strip().splitlines()[-1].startswith(says) and "Traceback" not in done.output


@pytest.mark.parametrize(("load", "says"), [
    # (1e9 − 1) / 1 + 1 = 1,000,000,000 concurrencies: the list alone took minutes and gigabytes before
    (["--high", "1e9", "--local"],
     "error: --low 1, --high 1e+09, --step 1: 1,000,000,000 loads to search, more than 100,000"),
    (["--high", "200000", "--step", "2", "--local"],
     "error: --high 200000: more requests in flight than the client keeps (at most 100,000)"),
    (["--high", "4", "--slo-ttft-ms-p99", "-1"], "error: --slo-ttft-ms-p99: Input should be greater than 0 (-1.0)"),
    (["--high", "4", "--slo", "tpot_ms_p90=0"], "error: --slo tpot_ms_p90: Input should be greater than 0 (0.0)"),
])
def test_a_load_grid_or_objective_out_of_bounds_is_refused_by_its_option(tmp_path: Path, load: list[str],
                                                                          says: str) -> None:
    done = CliRunner().invoke(app, [
        "search", "-f", str(ROOT / "polyaxonfiles" / "vllm-service.yaml"), "--inventory",
        str(ROOT / "prompts" / "tiny-qwen3-600x8"), "--slo-ttft-ms-p99", "400", "--out", str(tmp_path / "out"), *load])
    assert done.exit_code == 2, done.output
    assert done.output.strip().splitlines()[-1].startswith(says) and "Traceback" not in done.output
