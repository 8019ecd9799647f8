"""A run on the real vLLM CPU engine records the before-launch check for its own engine, and it holds."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from harness.launch.engine_process import ENGINE_MODULE, engine_python, local_engine_words
from harness.loopback import free_port
from harness.measure.figures import read_run_figures

HARNESS = str(Path(sys.executable).with_name("harness"))
INVENTORY = Path(__file__).resolve().parents[2] / "prompts" / "tiny-qwen3-600x8"


@pytest.mark.engine
def test_a_cpu_engine_run_records_the_before_launch_check_with_no_drift(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The tiny Qwen3 (4 layers × 2 × 2 KV heads × 32 × 2 B = 1,024 B per token, a block of 128 = 128 KiB) given
    4 MiB of KV: 32 blocks = 4,096 tokens before launch from engine.json alone, and the engine logs 4,096 — zero
    drift, so no qualification. One request of 4 tokens keeps the engine's time short."""
    engine = local_engine_words(
        ["python3", "-m", ENGINE_MODULE, "--model", str(tiny_model_dir), "--max-model-len", "1024",
         "--enforce-eager", "--kv-cache-memory-bytes", "4194304", "--api-key", secrets.token_hex(8)],
        engine_python(), free_port())
    run_dir = tmp_path / "run"
    done = subprocess.run([HARNESS, "run", "--inventory", str(INVENTORY), "--concurrency", "1", "--requests", "1",
                           "--max-tokens", "4", "--out", str(run_dir), "--", *engine],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode in (0, 3), done.stderr  # 3: served but invalid on a busy machine; the record stands
    capacity = json.loads((run_dir / "capacity.json").read_text())
    assert capacity["log"]["kv_cache_tokens"] == 4096, capacity["log"]  # what the engine logged
    drift = capacity["drift"]
    assert drift is not None, capacity["drift_note"]
    assert drift["basis"] == "kv_cache_memory_bytes" and drift["gpu_total_bytes"] is None
    assert (drift["kv_cache_tokens_predicted"], drift["kv_cache_tokens_logged"]) == (4096, 4096)
    assert drift["kv_cache_tokens_drift_share"] == 0 and drift["qualification"] is None
    assert drift["terms"] == [{"name": "kv_memory", "predicted_bytes": 4_194_304, "logged_bytes": 4_194_304,
                               "subtracted": True}]
    outputs = read_run_figures(run_dir).outputs()  # what the dashboard and the report read
    assert outputs["kv_cache_tokens_before_launch"] == 4096 and outputs["kv_cache_tokens_drift_share"] == 0
    assert "drift_term" not in outputs and "KV tokens drift" not in outputs.get("qualifications", "")
