"""A canary planted as the key in each entry point is in no file the harness leaves and in none of its output;
a server that wants a key the harness lacks is one line and exit code 2.

Every file under the test's folder is read as bytes, and each test says which files it must have read, so a
test that found nothing to read cannot pass.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness.launch.engine_process import ENGINE_MODULE, RunningEngine, engine_python, local_engine_words
from harness.loopback import free_port

from conftest import create_project, emulator, ran_but_for_a_busy_machine

HARNESS = str(Path(sys.executable).with_name("harness"))
INVENTORY = Path(__file__).resolve().parents[2] / "prompts" / "tiny-qwen3-600x8"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
ARGS_0_11 = LOGS / "vllm-0.11.2" / "kv-cache-memory-bytes-qwen3-4b.log"
REFUSED = "refused the request: HTTP 401, set VLLM_API_KEY to the engine's key"


@pytest.fixture
def canary() -> str:
    return f"canary-{secrets.token_hex(12)}"


def harness(*args: str, env_key: str | None, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` with VLLM_API_KEY set to `env_key`, or unset when None."""
    env = {name: value for name, value in os.environ.items() if name != "VLLM_API_KEY"}
    if env_key is not None:
        env["VLLM_API_KEY"] = env_key
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, timeout=timeout_s, env=env)


def assert_nowhere(canary: str, root: Path | None, *outputs: subprocess.CompletedProcess[str]) -> set[str]:
    """Read every file under `root` and every output; the canary is in none. Returns the names of the files read."""
    files = [path for path in root.rglob("*") if path.is_file()] if root is not None else []
    holding = [str(path) for path in files if canary.encode() in path.read_bytes()]
    printed = [f"{done.args[1]} {stream}" for done in outputs
               for stream, text in (("stdout", done.stdout), ("stderr", done.stderr)) if canary in text]
    assert holding == [] and printed == []
    return {path.name for path in files}


def run_args(out: Path, *more: str) -> list[str]:
    return ["run", "--inventory", str(INVENTORY), "--concurrency", "2", "--requests", "4", "--max-tokens", "4",
            "--out", str(out), *more]


def test_a_run_authenticated_with_the_canary_key_leaves_it_nowhere(
    canary: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulator requires the key as vLLM does (it reads VLLM_API_KEY); the run, its tracking and its report
    hold no trace of it."""
    monkeypatch.setenv("VLLM_API_KEY", canary)
    with emulator() as base_url:
        done = harness(*run_args(tmp_path / "run", "--base-url", base_url, "--offline-root",
                                 str(tmp_path / "offline")), env_key=canary)
        assert ran_but_for_a_busy_machine(done.returncode, tmp_path / "run"), done.stderr
        unauthenticated = httpx.post(f"{base_url}/v1/completions", json={"model": "emulated", "prompt": "x"})
        assert unauthenticated.status_code == 401  # the key was needed, and sent
    report = harness("report", "--runs", str(tmp_path / "run"), "--limit", "concurrency", "--out",
                     str(tmp_path / "report"), env_key=canary)
    assert report.returncode == 0, report.stderr
    read = assert_nowhere(canary, tmp_path, done, report)
    assert {"config.json", "summary.json", "requests.jsonl", "requests.parquet", "samples.jsonl", "run.plx.json",
            "report.md", "report.html"} <= read
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["requests_ok"] == 4


def test_a_missing_or_wrong_key_is_one_line_and_exit_code_2_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "the-emulators-key")
    with emulator() as base_url:
        started = time.monotonic()
        missing = harness(*run_args(tmp_path / "missing", "--base-url", base_url), env_key=None, timeout_s=60)
        wrong = harness(*run_args(tmp_path / "wrong", "--base-url", base_url), env_key="another-key", timeout_s=60)
        verify = harness("prompts", "verify", str(INVENTORY), "--server", base_url, env_key=None, timeout_s=60)
        elapsed_s = time.monotonic() - started
    assert (missing.returncode, wrong.returncode, verify.returncode) == (2, 2, 2)
    assert missing.stderr.strip().splitlines() == [f"error: server {base_url} {REFUSED}"]
    assert wrong.stderr.strip().splitlines() == [
        f"error: server {base_url} {REFUSED} (the key sent is not the engine's)"]
    assert verify.stderr.strip().splitlines()[-1] == f"error: server {base_url} {REFUSED}"
    assert elapsed_s < 45  # no wait for a server that will never take the request


def test_a_url_with_a_password_is_refused_without_printing_or_writing_it(
    canary: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with emulator() as base_url:
        with_password = base_url.replace("http://", f"http://user:{canary}@")
        shown = base_url.replace("http://", "http://***@")
        done = harness(*run_args(tmp_path / "run", "--base-url", with_password, "--offline-root",
                                 str(tmp_path / "offline")), env_key=None)
        verify = harness("prompts", "verify", str(INVENTORY), "--server", with_password, env_key=None)
        capacity = harness("capacity", "--metrics", f"{with_password}/metrics", env_key=None)
    assert (done.returncode, verify.returncode, capacity.returncode) == (2, 2, 2)
    assert done.stderr.strip().splitlines() == [
        f"error: --base-url {shown}: holds user info; put the engine's key in VLLM_API_KEY and give the URL without it"]
    assert verify.stderr.strip().splitlines()[-1].startswith(f"error: --server {shown}: holds user info")
    assert capacity.stderr.strip().startswith(f"error: --metrics {shown}/metrics: holds user info")
    assert assert_nowhere(canary, tmp_path, done, verify, capacity) == set()  # refused before writing anything


def test_a_start_up_log_holding_the_key_gives_a_capacity_report_without_it(canary: str, tmp_path: Path) -> None:
    """vLLM 0.11 logs `--api-key` in its non-default args; here the engine then fails quoting the key."""
    lines = ARGS_0_11.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].replace("'max_model_len': 8192", f"'max_model_len': 8192, 'api_key': ['{canary}']")
    lines.append("(EngineCore_DP0 pid=22) ERROR 11-29 11:00:30 [core.py:708] EngineCore failed to start.")
    lines.append(f"(EngineCore_DP0 pid=22) ERROR 11-29 11:00:30 [core.py:708] ValueError: token {canary} refused")
    log = tmp_path / "logs" / "engine.log"
    log.parent.mkdir()
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    as_json = harness("capacity", "--log", str(log), "--json", env_key=None)
    as_text = harness("capacity", "--log", str(log), env_key=None)
    assert as_json.returncode == 0 and as_text.returncode == 0, as_json.stderr + as_text.stderr
    assert_nowhere(canary, None, as_json, as_text)  # `harness capacity` writes no file, it prints
    report = json.loads(as_json.stdout)
    assert report["log"]["non_default_args"]["max_model_len"] == 8192  # the dict survived its masking
    assert report["log"]["non_default_args"]["api_key"] == ["***"]
    assert report["log"]["failure"]["error"] == "ValueError: token *** refused"


@pytest.mark.engine
def test_an_engine_started_with_the_canary_key_leaves_it_in_no_record_file(
    canary: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`harness run -- <engine --api-key CANARY>`: the client takes the key from the engine's command line, as
    vLLM does over VLLM_API_KEY (unset here); engine.json keeps the command line with the key masked."""
    engine = local_engine_words(
        ["python3", "-m", ENGINE_MODULE, "--model", str(tiny_model_dir), "--max-model-len", "1024",
         "--enforce-eager", "--kv-cache-memory-bytes", "4194304", "--api-key", canary], engine_python(), free_port())
    run_dir = tmp_path / "records" / "run"
    done = harness(*run_args(run_dir, "--offline-root", str(tmp_path / "records" / "offline"), "--", *engine),
                   env_key=None, timeout_s=900)
    assert done.returncode in (0, 3), done.stderr  # 3: finished but invalid; either way it was served
    assert json.loads((run_dir / "summary.json").read_text())["requests_ok"] == 4
    report = harness("report", "--runs", str(run_dir), "--limit", "kv_cache_memory_bytes", "--out",
                     str(tmp_path / "records" / "report"), env_key=None)
    assert report.returncode == 0, report.stderr
    read = assert_nowhere(canary, tmp_path / "records", done, report)
    assert {"engine.json", "config.json", "engine.log", "capacity.json", "summary.json", "run.plx.json",
            "report.md"} <= read
    argv = json.loads((run_dir / "engine.json").read_text())["argv"]
    assert argv[argv.index("--api-key") + 1] == "***"
    assert "non-default args" in (run_dir / "engine.log").read_text()  # the log that was copied is the engine's


@pytest.mark.engine
def test_the_real_engine_refuses_v1_without_its_key_and_serves_with_it(
    start_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """VLLM_API_KEY reaches the engine from the environment; /health stays open, /v1/* want the bearer key."""
    key = os.environ.get("VLLM_API_KEY") or secrets.token_hex(16)
    monkeypatch.setenv("VLLM_API_KEY", key)
    engine: RunningEngine = start_engine(max_num_seqs=2)
    bearer = {"Authorization": f"Bearer {key}"}
    model = httpx.get(f"{engine.base_url}/v1/models", headers=bearer, timeout=30).json()["data"][0]["id"]
    body = {"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 2}
    assert httpx.get(f"{engine.base_url}/health", timeout=30).status_code == 200
    assert httpx.post(f"{engine.base_url}/v1/completions", json=body, timeout=60).status_code == 401
    served = httpx.post(f"{engine.base_url}/v1/completions", json=body, headers=bearer, timeout=60)
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 2
    started = time.monotonic()
    refused = harness(*run_args(tmp_path / "run", "--base-url", engine.base_url), env_key=None, timeout_s=120)
    assert refused.returncode == 2 and time.monotonic() - started < 60
    assert refused.stderr.strip().splitlines() == [f"error: server {engine.base_url} {REFUSED}"]


@pytest.mark.engine
@pytest.mark.sandbox
def test_a_run_tracked_on_the_api_holds_no_trace_of_the_engines_key(
    canary: str, tiny_model_dir: Path, tmp_path: Path, polyaxon_api: str
) -> None:
    """The same engine, tracked on a real Polyaxon API: what the API stores of the run (its inputs, outputs,
    spec and statuses) holds no trace of the key, and the run it stores is the one measured."""
    from polyaxon.client import RunClient

    create_project("key-leaks")
    engine = local_engine_words(
        ["python3", "-m", ENGINE_MODULE, "--model", str(tiny_model_dir), "--max-model-len", "1024",
         "--enforce-eager", "--kv-cache-memory-bytes", "4194304", "--api-key", canary], engine_python(), free_port())
    run_dir = tmp_path / "run"
    done = harness(*run_args(run_dir, "--project", "default/key-leaks", "--", *engine), env_key=None, timeout_s=900)
    assert done.returncode in (0, 3), done.stderr
    uuid = json.loads((run_dir / "tracking.json").read_text())["run_uuid"]
    tracked = RunClient(owner="default", project="key-leaks", run_uuid=uuid)
    tracked.refresh_data()
    stored = json.dumps([tracked.run_data.to_dict(), tracked.get_statuses()], default=str)
    assert tracked.run_data.outputs["requests_ok"] == 4 and "kv_cache_memory_bytes" in stored
    assert canary not in stored
    assert_nowhere(canary, run_dir, done)
