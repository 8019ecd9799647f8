"""The self-contained experiment: reading the engine's limits, the record's identity, a failed start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.launch.engine_args import engine_port, option_value, with_option, without_option
from harness.launch.engine_process import ENGINE_MODULE, engine_base_url, engine_python, local_engine_words
from harness.launch.experiment import engine_limits
from harness.launch.specs import render
from harness.loopback import free_port
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.schedule import LoadShape
from harness.model_identity import read_identity
from harness.predict.model_shape import PINNED_REVISION

from conftest import LOCAL_CPU_PRESET, SERVICE_FILE

HARNESS = str(Path(sys.executable).with_name("harness"))
INVENTORY = Path(__file__).resolve().parents[2] / "prompts" / "tiny-qwen3-600x8"

ENGINE = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
          "--port", "8123", "--model", "/models/tiny", "--max-model-len", "1024", "--max-num-seqs=8",
          "--gpu-memory-utilization", "0.9", "--enforce-eager", "--no-enable-prefix-caching",
          "--kv-cache-memory-bytes=4194304", "--kv-cache-dtype", "auto"]


def test_engine_limits_are_the_engine_options_with_types_and_without_the_address() -> None:
    assert engine_limits(ENGINE) == {
        "model": "/models/tiny", "max_model_len": 1024, "max_num_seqs": 8, "gpu_memory_utilization": 0.9,
        "enforce_eager": True, "enable_prefix_caching": False, "kv_cache_memory_bytes": 4_194_304,
        "kv_cache_dtype": "auto",
    }
    assert engine_base_url(ENGINE) == "http://127.0.0.1:8123"
    assert engine_base_url(ENGINE[:3]) == "http://127.0.0.1:8000"  # vLLM's default port


def test_the_engine_words_are_read_and_set_one_way() -> None:
    argv = ["python", "-m", "m", "--port", "1", "--model=/a", "--enforce-eager", "--port=2", "--model", "/b"]
    assert option_value(argv, "--port") == "2" and option_value(argv, "--model") == "/b"  # the last one, as argparse
    assert option_value(argv, "--enforce-eager") is None and option_value(argv, "--seed") is None
    assert engine_port(argv) == 2
    assert with_option(argv, "--port", "9") == ["python", "-m", "m", "--model=/a", "--enforce-eager", "--model", "/b",
                                                "--port", "9"]
    assert with_option(["--host", "--enforce-eager"], "--host", "h") == ["--enforce-eager", "--host", "h"]
    assert without_option(argv, "--model") == ["python", "-m", "m", "--port", "1", "--enforce-eager", "--port=2"]


def test_a_generated_model_is_named_by_its_own_identity_and_never_by_the_specs_revision(tiny_model_dir: Path) -> None:
    """The service's default revision is Qwen3-4B's pin; the tiny model directory has none, and the engine
    ignores one for a directory: the local engine is started without it, and the limits name the directory
    by the seed and file hash its generator recorded."""
    rendered = render([SERVICE_FILE, LOCAL_CPU_PRESET], {"model": str(tiny_model_dir)}).argv
    assert option_value(rendered, "--revision") == PINNED_REVISION
    local = local_engine_words(rendered, Path("/venv/bin/python"), 43210)
    assert not any(word.startswith("--revision") for word in local)
    identity = read_identity(tiny_model_dir)
    assert identity is not None and identity.seed == 0
    for words in (local, rendered):  # started here, or as the spec wrote it (a directory in a cluster's image)
        limits = engine_limits(words)
        assert "revision" not in limits and PINNED_REVISION not in map(str, limits.values())
        assert limits | identity.limits() == limits  # model_generator, model_seed, model_files_sha256
    hub = render([SERVICE_FILE, LOCAL_CPU_PRESET], {"model": "Qwen/Qwen3-4B"}).argv
    assert engine_limits(local_engine_words(hub, Path("/venv/bin/python"), 43210))["revision"] == PINNED_REVISION
    assert "model_seed" not in engine_limits(hub)


def test_inside_a_managed_run_the_record_id_is_the_polyaxon_run_uuid(monkeypatch) -> None:
    options = RunOptions(inventory=INVENTORY, base_url="http://127.0.0.1:1", load=LoadShape(concurrency=1))
    assert len(build_run_config(options)[0].run_id) == 32
    monkeypatch.setenv("POLYAXON_RUN_INSTANCE", "acme.serving.runs.0123456789abcdef0123456789abcdef")
    assert build_run_config(options)[0].run_id == "0123456789abcdef0123456789abcdef"


@pytest.mark.engine
def test_an_engine_that_cannot_start_is_a_recorded_result_diagnosed_as_start_up_headroom(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """1 MiB of KV is 8 blocks of 128 tokens, one reserved: too few for one 2,048-token request."""
    engine = local_engine_words(
        ["python3", "-m", ENGINE_MODULE, "--model", str(tiny_model_dir), "--max-model-len", "2048",
         "--block-size", "128", "--enforce-eager", "--kv-cache-memory-bytes", "1048576"],
        engine_python(), free_port())
    run_dir, offline = tmp_path / "run", tmp_path / "offline"
    done = subprocess.run(
        [HARNESS, "run", "--inventory", str(INVENTORY), "--concurrency", "1", "--out", str(run_dir),
         "--offline-root", str(offline), "--", *engine], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: the engine did not start; its log and capacity are in {run_dir}"
    )
    assert "Traceback" not in done.stderr
    capacity = json.loads((run_dir / "capacity.json").read_text())
    assert capacity["log"]["capacity_found"] is False
    assert "maximum model length" in capacity["log"]["failure"]["error"]
    assert not (run_dir / "summary.json").exists() and (run_dir / "config.json").exists()
    uuid = json.loads((run_dir / "tracking.json").read_text())["run_uuid"]
    tracked = json.loads((offline / "runs" / uuid / "run.plx.json").read_text())
    assert tracked["inputs"]["kv_cache_memory_bytes"] == 1_048_576 and tracked["outputs"]["engine_started"] is False
    assert tracked["status"] == "failed"  # a run whose engine never served is not a succeeded run
    device = json.loads((run_dir / "device.json").read_text())
    assert device["gpu_name"] is None and device["cpu_model"] == tracked["inputs"]["cpu_model"] != ""

    report = subprocess.run([HARNESS, "report", "--runs", str(run_dir), "--limit", "kv_cache_memory_bytes",
                             "--out", str(tmp_path / "report")], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert f"{uuid}: weights and start-up headroom" in report.stdout
