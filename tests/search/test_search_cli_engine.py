"""`harness search` as a user runs it, on the real CPU engine with the tiny model and the local-cpu preset.

The model keeps 1,024 bytes of KV per token (4 layers × 2 KV heads × 32 dims × 2 (K and V) × 2 bytes), and
the inventory's requests are 600 prompt + 300 output tokens: 8 blocks of 128 each.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.search.objective import PercentileObjective

from conftest import HARNESS, LOCAL_CPU_PRESET, REPO_ROOT

pytestmark = pytest.mark.engine
EXPERIMENT = REPO_ROOT / "polyaxonfiles" / "experiment.yaml"
INVENTORY = REPO_ROOT / "prompts" / "tiny-qwen3-600x8"


def kv_sweep(tmp_path: Path, values: list[int]) -> Path:
    """A sweep file over kv_cache_memory_bytes, one point per value, as a user writes one."""
    sweep = {"kind": "operation", "name": "sweep-kv-cache", "pathRef": str(EXPERIMENT),
             "matrix": {"kind": "mapping", "concurrency": 1,
                        "values": [{"kv_cache_memory_bytes": value} for value in values]}}
    path = tmp_path / "sweep-kv-cache.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False), encoding="utf-8")
    return path


def search(tiny_model_dir: Path, files: list[Path], out: Path, limit: PercentileObjective,
           *options: str) -> subprocess.CompletedProcess[str]:
    """`harness search` against the p99 TTFT limit in this machine's unit (conftest.py `ttft_limit`)."""
    args = [HARNESS, "search", *(word for path in files for word in ("-f", str(path))), "-f", str(LOCAL_CPU_PRESET),
            "-P", f"model={tiny_model_dir}", "-P", "enable_prefix_caching=false", "--inventory", str(INVENTORY),
            "--slo-ttft-ms-p99", f"{limit.limit_ms:g}", "--local", "--out", str(out), *options]
    return subprocess.run(args, capture_output=True, text=True, timeout=900)


def search_run_outputs(out: Path, stdout: str) -> dict:
    """The outputs of the search's own offline run, found by the UUID the command printed."""
    run_uuid = stdout.split("search run ")[1].split()[0]
    return json.loads((out / "polyaxon" / "runs" / run_uuid / "run.plx.json").read_text())["outputs"]


def test_a_point_whose_engine_does_not_start_is_recorded_and_the_next_point_is_searched(
    tmp_path: Path, tiny_model_dir: Path, ttft_limit: PercentileObjective
) -> None:
    # With max_model_len 2,048, 1 MiB of KV is 1,024 tokens = 8 blocks, one kept as the null block: 896 tokens,
    # less than one 2,048-token sequence, so vLLM refuses at start-up. 4 MiB is 32 blocks, 31 usable: 3 of
    # these requests fit (24 blocks), 4 do not (32 > 31): no limit binds up to --high 2, and bisection over
    # concurrency 1 and 2 measures 1, then 2, both with every request running, well within the limit.
    out = tmp_path / "out"
    objective_line = f"max concurrency meeting {ttft_limit.words}"
    done = search(tiny_model_dir, [kv_sweep(tmp_path, [1_048_576, 4_194_304])], out, ttft_limit,
                  "-P", "max_model_len=2048", "--high", "2")
    assert done.returncode == 3, done.stderr[-3000:]  # finished, but a point failed
    assert "Traceback" not in done.stderr
    failed_log = out / "point-0" / "engine.log"
    printed = done.stdout.split("kv_cache_memory_bytes=4194304:\n")
    assert len(printed) == 2 and printed[0].startswith("kv_cache_memory_bytes=1048576:\n"), done.stdout
    assert f"{objective_line}: not searched: engine exited with code 1 before it was healthy: ValueError:" \
        in printed[0]
    assert "estimated maximum model length is 896" in printed[0] and f"engine log: {failed_log}" in printed[0]
    assert "ValueError: To serve at least one request" in failed_log.read_text()

    result = json.loads((out / "search.json").read_text())
    [failed] = result["failed"]
    assert failed["index"] == 0 and failed["point"] == {"kv_cache_memory_bytes": 1_048_576}
    assert failed["engine_log"] == str(failed_log) and "estimated maximum model length is 896" in failed["reason"]
    [searched] = result["configurations"]
    assert searched["index"] == 1 and searched["engine_log"] == str(out / "point-1" / "engine.log")
    assert searched["trace"]["stopped_reason"] is None, searched["trace"]["stopped_reason"]  # e.g. client stalled
    prediction = searched["trace"]["prediction"]
    assert prediction["usable_blocks"] == 31 and prediction["knee_concurrency"] is None
    assert searched["answer"]["capacity"] == 2.0 and printed[1].startswith(f"{objective_line}: at least 2, ")
    for step in searched["trace"]["steps"]:
        assert all(Path(probe["run_dir"]).parent == out / "point-1" for probe in step["probes"])

    report = (out / "search.md").read_text()
    assert report.index("## kv_cache_memory_bytes=1048576") < report.index("## kv_cache_memory_bytes=4194304")
    assert f"**{objective_line}: not searched: " in report and f"engine log: {failed_log}" in report
    outputs = search_run_outputs(out, done.stdout)
    assert "estimated maximum model length is 896" in outputs["not_searched_point_0"]
    assert outputs["capacity_concurrency_point_1"] == 2.0


def test_a_rate_search_answers_in_requests_per_second_with_open_loop_probes_under_the_cap(
    tmp_path: Path, tiny_model_dir: Path, ttft_limit: PercentileObjective
) -> None:
    # The preset's engine: 31 usable blocks hold 3 of these requests at their largest, so with --max-concurrency 4
    # preemption (from 4 in flight) is within the cap, and arrivals would wait for blocks only from 6 in flight,
    # beyond it: no knee is predicted within the cap. Which rate keeps 4 in flight depends on how long
    # each request stays, so the prediction does not bracket the rates: bisection starts at the middle of
    # 1, 2, 3, 4 requests/s, index (-1 + 4) // 2 = 1, i.e. 2 requests/s. Each probe sends the cap's 4 warm-up
    # requests, then max(--min-requests 8, --turnovers 1 × 4) = 8 measured ones.
    out = tmp_path / "out"
    done = search(tiny_model_dir, [REPO_ROOT / "polyaxonfiles" / "vllm-service.yaml"], out, ttft_limit,
                  "--over", "rate", "--low", "1", "--high", "4", "--max-concurrency", "4", "--turnovers", "1",
                  "--min-requests", "8")
    assert done.returncode == 0, done.stderr[-3000:]  # a probe invalid twice (client stalled) exits 3
    assert ("preemption from 4" in done.stderr
            and "a rate search is not bracketed by it: its rates are bisected from the middle of the range"
            in done.stderr), done.stderr
    assert "step 1: rate 2 requests/s, " in done.stderr

    [searched] = json.loads((out / "search.json").read_text())["configurations"]
    steps, answer = searched["trace"]["steps"], searched["answer"]
    assert steps[0]["value"] == 2.0 and answer["knob"] == "rate"
    for step in steps:
        for probe in step["probes"]:
            load = json.loads((Path(probe["run_dir"]) / "config.json").read_text())["load"]
            assert (load["rate_per_s"], load["max_concurrency"], load["concurrency"]) == (step["value"], 4, None)
            assert (load["warmup_requests"], load["requests"]) == (4, 8)
    capacity, lines = answer["capacity"], done.stdout.splitlines()
    if capacity is None:
        # a CPU slow enough that a request holds its slot over 4 s: 4 slots admit under 1 request/s, so even
        # the lowest rate waits for slots, and the answer says the client's cap, not the server, is why
        assert lines[0].startswith(f"no rate in the range meets {ttft_limit.words}; at 1 requests/s "), lines[0]
        assert answer["bound_by"] == "max_concurrency (the client's cap)", answer["cause"]
        assert "the most the cap admits" in answer["cause"]
    else:
        assert capacity in (1.0, 2.0, 3.0, 4.0), done.stdout
        capacity_words = "at least 4 requests/s" if capacity == 4.0 else f"{capacity:g} requests/s;"
        assert lines[0].startswith(f"max rate meeting {ttft_limit.words}: {capacity_words}"), lines[0]
        if answer["first_short"] is not None and answer["first_short_reading"]["decision"] == "undecided":
            # its interval straddled the limit through every repeat: the line says so, and no cause is claimed for it
            assert f"; at {answer['first_short']:g} requests/s undecided: p99 is " in lines[0]
        elif answer["first_short"] is not None:
            assert f"; at {answer['first_short']:g} requests/s p99 is " in lines[0]
            # measured here: a request holds its slot 1.5-1.9 s, so 4 slots admit 2.1-2.7 requests/s; at the first
            # rate short, requests wait for a slot (up to 760 ms at 2 requests/s), while counted from when their
            # slot came free their TTFT stays within the limit: the client's queue, not the server, broke the objective
            assert answer["bound_by"] == "max_concurrency (the client's cap)", answer["cause"]
            assert f"at {answer['first_short']:g} requests/s " in answer["cause"] and "the most the cap admits" in \
                answer["cause"]
            assert answer["remedy"].startswith("--max-concurrency ") or answer["remedy"].startswith("not the cap alone")
    assert "predicted knee concurrency none in the range in flight, which does not bracket a rate search" \
        in lines[-2]
    outputs = search_run_outputs(out, done.stdout)
    assert outputs.get("capacity_rate_per_s") == capacity and outputs.get("predicted_knee_concurrency") is None
    assert "| step | repeat | rate (requests/s) | run |" in (out / "search.md").read_text()
