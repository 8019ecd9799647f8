"""Faults a real run meets, against the emulated server: what is recorded, what the summary and the report
say, the exit code, and how long the run takes to end.

The client is what is under test, so the server is the emulator (`harness emulate`) in its own process,
killed or frozen like a real one; the run is `harness run` in its own process, stopped like a real one.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange, write_inventory
from harness.measure.client import STALL_SLACK, ErrorClass
from harness.measure.figures import read_run_figures
from harness.measure.record import read_requests

from conftest import emulator, emulator_process, ran_but_for_a_busy_machine

HARNESS = str(Path(sys.executable).with_name("harness"))
# Each request: 20 ms to the first token, then 9 more tokens 20 ms apart: about 0.2 s.
SERVER = {"ttft_ms": 20, "itl_ms": 20}


@pytest.fixture(scope="module")
def inventory_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=10, high=1900), prompt_tokens=[16, 24, 32, 40] * 2,
                           output_cap_tokens=[10] * 8, seed=0)
    return write_inventory(build_token_id_inventory("faults-8", recipe), tmp_path_factory.mktemp("inventory"))


def start_run(inventory_dir: Path, base_url: str, out: Path, *options: str, requests: int = 200) -> subprocess.Popen:
    args = [HARNESS, "run", "--inventory", str(inventory_dir), "--out", str(out), "--base-url", base_url,
            "--concurrency", "4", "--requests", str(requests), "--max-tokens", "10", "--sample-interval-s", "0.2",
            "--ready-timeout-s", "20", *options]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished_lines(out: Path, at_least: int, timeout_s: float = 30.0) -> int:
    """Wait until the run has appended `at_least` requests; returns how many it had then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = out / "requests.jsonl"
        count = path.read_text().count("\n") if path.exists() else 0
        if count >= at_least:
            return count
        time.sleep(0.02)
    raise AssertionError(f"fewer than {at_least} requests recorded in {timeout_s} s")


def ended_within(process: subprocess.Popen, timeout_s: float) -> tuple[float, str]:
    """Seconds the run took to end after the fault, and its stderr."""
    started = time.monotonic()
    _, stderr = process.communicate(timeout=timeout_s)
    return time.monotonic() - started, stderr


def report(runs: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([HARNESS, "report", "--runs", str(runs), "--limit", "concurrency", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


def test_a_server_killed_mid_run_makes_an_invalid_run_that_names_the_server(
    inventory_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "runs" / "killed"
    with emulator_process(**SERVER) as (base_url, server):
        run = start_run(inventory_dir, base_url, out, "--read-timeout-s", "5", "--stall-timeout-s", "2")
        finished_lines(out, 12)
        server.kill()
        seconds, stderr = ended_within(run, 60)
    print(f"server killed: the run ended {seconds:.1f} s later")
    assert run.returncode == 3, stderr  # finished, invalid
    assert seconds < 15  # refused connections fail at once; nothing waits for a read timeout
    summary = json.loads((out / "summary.json").read_text())
    records = read_requests(out)
    assert len(records) == summary["requests_sent"] == 200  # every request has its record
    errors = summary["errors_by_class"]
    # Reset: the 4 in flight at the kill, and at most one more per worker that reused a kept-alive connection
    # the kill had closed. Every later request is refused, not reset.
    assert set(errors) <= {"connection_refused", "connection_reset"} and errors["connection_refused"] >= 150
    assert errors.get("connection_reset", 0) <= 8
    assert summary["error_rate_fraction"] == pytest.approx(sum(errors.values()) / 200)
    assert summary["valid"] is False
    assert any(reason.startswith("requests failed: error_rate_fraction 0.9") for reason in summary["invalid_reasons"])
    refused = next(r for r in records if r.error_class == ErrorClass.connection_refused)
    assert "Connect" in (refused.error or "")
    outputs = read_run_figures(out).outputs()  # what the Polyaxon dashboard shows
    assert outputs["errors_connection_refused"] == errors["connection_refused"]
    assert outputs["error_rate_connection_refused_fraction"] == pytest.approx(errors["connection_refused"] / 200)
    assert outputs["valid"] is False and outputs["invalid_reasons"].startswith("requests failed")
    written = report(tmp_path / "runs", tmp_path / "report")
    assert written.returncode == 0, written.stderr
    assert written.stdout.startswith(f"{summary['run_id']}: server dead or failing (requests failed)")
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "error_rate_fraction" in markdown and "errors_connection_refused=" in markdown


def test_a_frozen_server_ends_each_request_at_its_stall_or_read_timeout(inventory_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "frozen"
    # Requests of 20 ms + 9 x 100 ms: frozen 0.3 s into the second wave, its 4 requests are mid-stream.
    with emulator_process(ttft_ms=20, itl_ms=100) as (base_url, server):
        run = start_run(inventory_dir, base_url, out, "--read-timeout-s", "3", "--stall-timeout-s", "1.5",
                        requests=12)
        finished_lines(out, 4)
        time.sleep(0.3)
        server.send_signal(signal.SIGSTOP)
        seconds, stderr = ended_within(run, 60)
    print(f"server frozen: the run ended {seconds:.1f} s later")
    assert run.returncode == 3, stderr
    # In flight: silent for 1.5 s (stalled); then the last 4 get no byte for 3 s (timeout); then one last
    # /metrics scrape with its 2 s timeout: about 1.5 + 3 + 2 = 6.5 s.
    assert seconds < 12
    summary = json.loads((out / "summary.json").read_text())
    errors = summary["errors_by_class"]
    assert set(errors) <= {"stalled", "timeout"} and errors.get("stalled", 0) >= 1 and errors["timeout"] >= 4
    assert summary["requests_ok"] >= 4 and summary["requests_ok"] + sum(errors.values()) == 12
    records = read_requests(out)
    stalled = [r for r in records if r.error_class == ErrorClass.stalled]
    assert all(r.chunk_times_s and "stall timeout" in (r.error or "") for r in stalled)  # tokens, then silence
    # Called after at least the stall timeout of silence, at most STALL_SLACK of it later (plus the loop's turn).
    assert all(1.5 <= r.end_s - r.chunk_times_s[-1] < 1.5 * (1 + STALL_SLACK) + 0.2 for r in stalled)
    timed_out = [r for r in records if r.error_class == ErrorClass.timeout]
    assert all(2.9 <= r.end_s - r.dispatch_s < 4.0 and not r.chunk_times_s for r in timed_out)
    assert summary["failed_scrapes"] >= 1 and summary["valid"] is False


@pytest.mark.parametrize(("stop", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_client_records_its_requests_in_flight_and_exits_as_stopped(
    inventory_dir: Path, tmp_path: Path, stop: signal.Signals, exit_code: int
) -> None:
    out = tmp_path / "runs" / "stopped"
    with emulator(**SERVER) as base_url:
        run = start_run(inventory_dir, base_url, out)
        seen = finished_lines(out, 12)
        run.send_signal(stop)
        seconds, stderr = ended_within(run, 30)
    print(f"client {stop.name}: the run ended {seconds:.1f} s later")
    assert run.returncode == exit_code, stderr  # 128 + the signal: a script sees a stopped run
    assert seconds < 5
    summary = json.loads((out / "summary.json").read_text())
    records = read_requests(out)
    cancelled = [r for r in records if r.error_class == ErrorClass.cancelled]
    assert 1 <= len(cancelled) <= 4 and len(records) - len(cancelled) >= seen
    assert summary["stopped_by_signal"] == stop.name and summary["valid"] is False
    assert summary["invalid_reasons"] == [f"run stopped early by {stop.name}"]
    assert summary["error_rate_fraction"] == 0.0  # the client stopped them; the server failed nothing
    written = report(tmp_path / "runs", tmp_path / "report")
    assert written.returncode == 0, written.stderr
    assert f"run stopped early by {stop.name}" in (tmp_path / "report" / "report.md").read_text()


def test_a_killed_client_loses_only_its_requests_in_flight(inventory_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "killed"
    with emulator(**SERVER) as base_url:
        run = start_run(inventory_dir, base_url, out)
        seen = finished_lines(out, 12)
        run.kill()
        run.wait(timeout=10)
    assert run.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    records = read_requests(out)  # from the JSONL appended while the run lived
    assert len(records) >= seen and len({r.index for r in records}) == len(records)
    assert all(r.error_class is None and r.output_tokens == 10 for r in records)
    written = report(tmp_path / "runs", tmp_path / "report")
    assert written.returncode == 0, written.stderr
    assert "summary missing" in (tmp_path / "report" / "report.md").read_text()


@pytest.fixture(scope="module")
def finished_run(inventory_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    with emulator(**SERVER) as base_url:
        run = start_run(inventory_dir, base_url, out, requests=8)
        _, stderr = run.communicate(timeout=60)
    assert ran_but_for_a_busy_machine(run.returncode, out), stderr
    return out


def test_an_out_that_holds_a_run_is_refused_and_force_moves_it_aside(
    finished_run: Path, inventory_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    first_id = json.loads((out / "config.json").read_text())["run_id"]
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    with emulator(**SERVER) as base_url:
        refused = start_run(inventory_dir, base_url, out, requests=8)
        _, stderr = refused.communicate(timeout=60)
        assert refused.returncode == 2
        assert stderr.strip().splitlines() == [
            f"error: --out {out}: already holds run {first_id} (config.json, environment.json, requests.jsonl, "
            "requests.parquet, samples.jsonl, summary.json); give a new directory, or --force to move the old run "
            "aside"]
        assert {path.name: path.read_bytes() for path in out.iterdir()} == before  # not a byte changed
        forced = start_run(inventory_dir, base_url, out, "--force", requests=8)
        _, stderr = forced.communicate(timeout=60)
    assert ran_but_for_a_busy_machine(forced.returncode, out), stderr
    aside = tmp_path / f"run.replaced-{first_id}"
    assert f"moved the run that was in {out} to {aside}" in stderr
    assert {path.name: path.read_bytes() for path in aside.iterdir()} == before
    second_id = json.loads((out / "config.json").read_text())["run_id"]
    assert second_id != first_id and json.loads((out / "summary.json").read_text())["run_id"] == second_id
    assert (out / "requests.jsonl").read_text().count("\n") == len(pd.read_parquet(out / "requests.parquet")) == 8


def _half_parquet(run: Path) -> None:
    table = run / "requests.parquet"
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])


def _extra_request(run: Path) -> None:
    with (run / "requests.jsonl").open("a") as requests:
        requests.write((run / "requests.jsonl").read_text().splitlines()[0] + "\n")


def _other_runs_config(run: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "run_id": "f" * 32}))


def _cut_last_line(run: Path) -> None:
    text = (run / "requests.jsonl").read_text()
    (run / "requests.jsonl").write_text(text[:-40])


def _corrupt_line_of_a_killed_run(run: Path) -> None:
    (run / "summary.json").unlink()
    (run / "requests.parquet").unlink()
    lines = (run / "requests.jsonl").read_text().splitlines()
    lines[2] = lines[2][:30]
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(("damage", "message"), [
    (_half_parquet, "requests.parquet: not a readable Parquet table"),
    (_extra_request, "requests.jsonl holds 9 requests but requests.parquet 8; the record is truncated or mixes "
                     "two runs"),
    (_other_runs_config, f"summary.json is run {{run_id}} but config.json is run {'f' * 32}; two runs were "
                         "written into one folder"),
    (_cut_last_line, "requests.jsonl: last line cut short, though summary.json says the run finished"),
    (_corrupt_line_of_a_killed_run, "requests.jsonl: line 3 is not a request record"),
], ids=["half-written-parquet", "appended-jsonl", "mixed-config", "truncated-jsonl", "corrupt-line"])
def test_report_refuses_a_damaged_record_in_one_line_naming_the_file(
    finished_run: Path, tmp_path: Path, damage, message: str
) -> None:
    run = tmp_path / "runs" / "run"
    shutil.copytree(finished_run, run)
    run_id = json.loads((run / "summary.json").read_text())["run_id"]
    damage(run)
    written = report(tmp_path / "runs", tmp_path / "report")
    assert written.returncode == 2
    [line] = written.stderr.strip().splitlines()
    assert line.startswith("error: ") and message.format(run_id=run_id) in line


def test_a_stopped_local_sweep_passes_the_stop_to_its_point(inventory_dir: Path, tmp_path: Path) -> None:
    """`harness run-local` stopped by SIGTERM: the point in progress is stopped the same way, so it records its
    requests in flight and writes its summary before the sweep exits 143."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "kind: component\n"
        "inputs: [{name: base_url, type: str}, {name: inventory, type: str}]\n"
        "run:\n  kind: job\n  container:\n    image: local\n"
        "    command: [harness, run, --base-url, '{{ base_url }}', --inventory, '{{ inventory }}', --concurrency, '4',"
        " --requests, '400', --max-tokens, '10', --sample-interval-s, '0.2',"
        " --out, '{{ globals.run_outputs_path }}/run']\n")
    out = tmp_path / "points"
    with emulator(**SERVER) as base_url:
        sweep = subprocess.Popen([HARNESS, "run-local", "-f", str(job), "-P", f"base_url={base_url}",
                                  "-P", f"inventory={inventory_dir}", "--out", str(out),
                                  "--offline-root", str(tmp_path / "polyaxon")],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        finished_lines(out / "point-0" / "run", 12)
        sweep.send_signal(signal.SIGTERM)
        seconds, stderr = ended_within(sweep, 60)
    print(f"run-local SIGTERM: the sweep ended {seconds:.1f} s later")
    assert sweep.returncode == 143, stderr
    summary = json.loads((out / "point-0" / "run" / "summary.json").read_text())
    assert summary["stopped_by_signal"] == "SIGTERM" and summary["errors_by_class"].get("cancelled", 0) >= 1
