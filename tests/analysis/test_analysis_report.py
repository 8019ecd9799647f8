"""`harness report` over constructed records: the page's content, its plots, and one-line bad input."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest

from run_records import STARVED_LOG, write_failed_run, write_run

HARNESS = str(Path(sys.executable).with_name("harness"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def harness(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def kv_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """kv_cache_memory_bytes swept at concurrency 4 over max_num_seqs 2: too small to start, starved, ample."""
    root = tmp_path_factory.mktemp("kv-sweep")
    return {
        "crashed": write_failed_run(root, limits={"kv_cache_memory_bytes": 65_536, "max_num_seqs": 2}),
        "starved": write_run(root, limits={"kv_cache_memory_bytes": 4_194_304, "max_num_seqs": 2}, log=STARVED_LOG,
                             prompt_tokens=1100, ttft_ms=900.0,
                             samples=[(2, 2, 0.6, 0), (3, 2, 0.97, 1)]),
        "ample": write_run(root, limits={"kv_cache_memory_bytes": 1_073_741_824, "max_num_seqs": 2},
                           samples=[(2, 2, 0.01, 0), (2, 2, 0.01, 0)]),
        "repeat": write_run(root, limits={"kv_cache_memory_bytes": 1_073_741_824, "max_num_seqs": 2}, ttft_ms=70.0,
                            samples=[(1, 2, 0.01, 0)]),
    }


def test_report_names_each_run_its_limit_and_evidence(kv_sweep: dict[str, Path], tmp_path: Path) -> None:
    done = harness("report", "--runs", kv_sweep["starved"].parent, "--limit", "kv_cache_memory_bytes",
                   "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    printed = dict(line.split(": ", 1) for line in done.stdout.splitlines() if not line.startswith("report:"))
    assert printed == {kv_sweep["crashed"].name: "weights and start-up headroom",
                       kv_sweep["starved"].name: "KV cache capacity",
                       kv_sweep["ample"].name: "max_num_seqs (scheduling)",
                       kv_sweep["repeat"].name: "max_num_seqs (scheduling)"}
    assert f"report: {tmp_path / 'report.md'} and {tmp_path / 'report.html'}" in done.stdout

    markdown = (tmp_path / "report.md").read_text()
    diagnosis = markdown.split("## Diagnosis")[1].split("## ")[0]
    starved_line = next(line for line in diagnosis.splitlines() if kv_sweep["starved"].name in line)
    assert "| 4194304 | KV cache capacity |" in starved_line
    assert "preemptions_during_run=1" in starved_line and "kv_cache_tokens_logged=4096" in starved_line
    # max_num_seqs 2 of the 4 in flight x (1100 + 20 tokens in ceil(1120 / 128) = 9 blocks of 128) = 2 x 1,152
    assert "kv_tokens_needed_padded=2304" in starved_line
    ample_line = next(line for line in diagnosis.splitlines() if kv_sweep["ample"].name in line)
    assert "peak_waiting_requests=2" in ample_line and "max_num_seqs=2" in ample_line
    # the ample point has two runs: TTFT 50 and 70 ms, so mean 60 [50, 70]
    points = markdown.split("## Points of kv_cache_memory_bytes")[1].split("## ")[0]
    ample_point = next(line for line in points.splitlines() if line.startswith("| 1073741824 |"))
    assert "| 2 | 60 [50, 70] |" in ample_point
    assert kv_sweep["ample"].name in ample_point and kv_sweep["repeat"].name in ample_point
    capacity = markdown.split("## Predicted vs logged capacity")[1].split("## ")[0]
    # 4 MiB / 1,024 KV bytes per token = 4,096 tokens, predicted and logged; max concurrency 4096/1024 = 4
    assert f"| {kv_sweep['starved'].name} | 4194304 | 4096 | 4096 | 4 | 4 | 32 | 32 | True |" in capacity
    assert "| concurrency (requests) | 4 |" in markdown.split("## Held fixed")[1].split("## ")[0]
    drift = markdown.split("## Before launch vs logged, per term")[1].split("## ")[0]
    # The CPU engine is given its KV memory (4 MiB, as the log's arguments state it exactly): the before-launch
    # check is the bytes per token, 4,096 tokens both ways, no drift, no term off; the GPU terms are not there.
    starved_drift = next(line for line in drift.splitlines() if kv_sweep["starved"].name in line)
    assert f"| {kv_sweep['starved'].name} | 4194304 | 4096 | 4096 | 0 | – |" in starved_drift
    assert starved_drift.endswith("| – / – | – / – | – / – | – / – | 4.0 / 4.0 |")  # 4,194,304 B = 4.0 MiB
    assert "KV tokens drift" not in markdown  # no run drifted, so none is qualified for it

    for name in ("latency.png", "throughput-vs-ttft.png", f"series-{kv_sweep['starved'].name}.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC), name
    page = (tmp_path / "report.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == 2 + 3  # latency, throughput, and the three runs that sampled /metrics
    assert all(base64.b64decode(image).startswith(PNG_MAGIC) for image in images)
    assert "src='http" not in page and kv_sweep["crashed"].name in page


def test_conversations_are_shown_turn_by_turn_with_their_run(kv_sweep: dict[str, Path], tmp_path: Path) -> None:
    talk = write_run(tmp_path / "runs", limits={"kv_cache_memory_bytes": 1_073_741_824}, turns=2)
    done = harness("report", "--runs", tmp_path / "runs", "--limit", "kv_cache_memory_bytes", "--out", tmp_path / "r")
    assert done.returncode == 0, done.stderr
    markdown = (tmp_path / "r" / "report.md").read_text()
    section = markdown.split("## Conversations turn by turn")[1].split("## ")[0]
    assert ("| run_uuid | kv_cache_memory_bytes | turn | requests_ok (requests) | prompt_tokens_mean | ttft_ms_mean "
            "| ttft_ms_p50 | ttft_ms_p99 | hit_tokens_predicted_mean | cached_prompt_tokens_mean |") in section
    # 8 requests of 2 turns: turn 1 is requests 0, 2, 4, 6, first tokens 50 + i ms after sending: 50, 52, 54 and
    # 56 ms, mean and p50 53, p99 (numpy's linear) 54 + 0.97 x 2 = 55.94; turn 2 is requests 1, 3, 5, 7 at
    # 100 + i: mean and p50 104, p99 106.94, shown to four figures as 106.9. No prediction was recorded; turn 2
    # reported 64 tokens cached, turn 1 none.
    assert f"| {talk.name} | 1073741824 | 1 | 4 | 100 | 53 | 53 | 55.94 | – | 0 |" in section
    assert f"| {talk.name} | 1073741824 | 2 | 4 | 100 | 104 | 104 | 106.9 | – | 64 |" in section
    assert "<h2>Conversations turn by turn</h2>" in (tmp_path / "r" / "report.html").read_text()
    # runs without conversations leave the section out
    plain = harness("report", "--runs", kv_sweep["ample"].parent, "--limit", "kv_cache_memory_bytes", "--out",
                    tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr
    assert "Conversations turn by turn" not in (tmp_path / "plain" / "report.md").read_text()


def test_bad_input_is_one_line_and_exit_2(kv_sweep: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cases: list[tuple[list[str | Path], str]] = [
        (["--runs", tmp_path / "empty", "--limit", "max_num_seqs"],
         f"no run records found in --runs {tmp_path / 'empty'}"),
        (["--runs", kv_sweep["starved"].parent, "--limit", "max_num_sequences"], "unknown limit 'max_num_sequences'"),
        (["--runs", kv_sweep["starved"].parent, "--limit", "max_num_seqs"],
         "runs differ in more than 'max_num_seqs': kv_cache_memory_bytes: "),
        (["--offline-root", tmp_path / "empty", "--limit", "max_num_seqs"],
         f"{tmp_path / 'empty'}: not a Polyaxon offline root"),
    ]
    broken = tmp_path / "broken"
    run_dir = write_run(broken)
    (run_dir / "capacity.json").write_text('{"schema_version": 1}')
    cases.append((["--runs", broken, "--limit", "max_num_seqs"], f"{run_dir / 'capacity.json'}: field 'log'"))
    for args, expected in cases:
        done = harness("report", *args, "--out", tmp_path / "out")
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.startswith(f"error: {expected}"), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
