"""The self-contained experiment's pieces that need no engine: reading the engine's limits, identity."""

from __future__ import annotations

from pathlib import Path

from harness.experiment import engine_limits
from harness.launch import engine_base_url
from harness.runner import build_run_config

ENGINE = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
          "--port", "8123", "--model", "/models/tiny", "--max-model-len", "1024", "--max-num-seqs=8",
          "--gpu-memory-utilization", "0.9", "--enforce-eager", "--no-enable-prefix-caching",
          "--kv-cache-memory-bytes=4194304", "--kv-cache-dtype", "auto"]


def test_engine_limits_are_the_engine_options_with_types_and_without_the_address():
    assert engine_limits(ENGINE) == {
        "model": "/models/tiny", "max_model_len": 1024, "max_num_seqs": 8, "gpu_memory_utilization": 0.9,
        "enforce_eager": True, "enable_prefix_caching": False, "kv_cache_memory_bytes": 4_194_304,
        "kv_cache_dtype": "auto",
    }
    assert engine_base_url(ENGINE) == "http://127.0.0.1:8123"
    assert engine_base_url(ENGINE[:3]) == "http://127.0.0.1:8000"  # vLLM's default port


def test_inside_a_managed_run_the_record_id_is_the_polyaxon_run_uuid(monkeypatch):
    inventory = Path(__file__).resolve().parents[1] / "prompts" / "tiny-qwen3-600x8"
    options = dict(inventory=inventory, base_url="http://127.0.0.1:1", service_uuid=None, service_port=8000,
                   concurrency=1, rate=None, burstiness=1.0, max_concurrency=None, max_tokens=None, requests=None,
                   duration_s=None, warmup=0, seed=0, order="inventory", temperature=0.0, slo_ttft_ms=None,
                   slo_tpot_ms=None, cold=False, sample_interval_s=1.0, max_dispatch_lag_ms=10.0)
    assert len(build_run_config(**options)[0].run_id) == 32
    monkeypatch.setenv("POLYAXON_RUN_INSTANCE", "acme.serving.runs.0123456789abcdef0123456789abcdef")
    assert build_run_config(**options)[0].run_id == "0123456789abcdef0123456789abcdef"
