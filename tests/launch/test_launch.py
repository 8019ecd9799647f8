"""The local launcher: the service polyaxonfile runs on the real vLLM CPU engine and never leaks a process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import HarnessError
from harness.launch.engine_args import option_value
from harness.launch.engine_process import (
    WATCHDOG,
    engine_python,
    local_engine,
    local_engine_words,
    stop_process_group,
)
from harness.launch.specs import render
from harness.server_auth import auth_headers

import child_programs
from conftest import LOCAL_CPU_PRESET, SERVICE_FILE, local_cpu_engine


def live_group_members(pgid: int) -> list[int]:
    """Processes of a process group that are still running (zombies awaiting their reaper do not count)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def wait_until_group_gone(pgid: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := live_group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_container_command_is_mapped_onto_the_engine_venv() -> None:
    rendered = render([SERVICE_FILE, LOCAL_CPU_PRESET], {"model": "/models/tiny", "max_num_seqs": 4})
    argv = local_engine_words(rendered.argv, Path("/venv/bin/python"), 43210)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--model=/models/tiny" in argv
    assert "--max-num-seqs=4" in argv  # the param wins over the preset's 8
    assert "--block-size=128" in argv  # the preset fills what the params left out
    assert "--enforce-eager" in argv and "--kv-cache-memory-bytes=4194304" in argv
    # The image listens on 0.0.0.0:8000; locally it is loopback and the chosen port, each given once.
    assert not any(word.startswith(("--host=", "--port=")) for word in argv)
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv.count("--port") == 1 and argv[argv.index("--port") + 1] == "43210"


def test_a_port_in_use_is_refused_before_the_engine_starts(tiny_model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(HarnessError, match=f"port {port} on 127.0.0.1 is already in use"), local_engine(
            [SERVICE_FILE, LOCAL_CPU_PRESET], {"model": str(tiny_model_dir)}, log_path=tmp_path / "e.log", port=port
        ):
            pytest.fail("the engine should not have started")
        served = CliRunner().invoke(
            app, ["serve", "-f", str(SERVICE_FILE), "-f", str(LOCAL_CPU_PRESET), "-P", f"model={tiny_model_dir}",
                  "--port", str(port), "--log", str(tmp_path / "e.log")],
        )  # fmt: skip
        assert served.exit_code == 2
        assert served.output == f"error: port {port} on 127.0.0.1 is already in use (Address already in use)\n"
    assert not (tmp_path / "e.log").exists()


def test_stopping_kills_a_child_that_ignores_sigterm_after_the_grace_period() -> None:
    leader = subprocess.Popen(
        child_programs.argv("stubborn-tree"), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert leader.stdout is not None
    child_pid = int(leader.stdout.readline())
    assert sorted(live_group_members(leader.pid)) == sorted([leader.pid, child_pid])
    started = time.monotonic()
    stop_process_group(leader, grace_s=1.0)
    elapsed_s = time.monotonic() - started
    assert wait_until_group_gone(leader.pid, timeout_s=5) == []
    assert 1.0 <= elapsed_s < 5.0  # the leader obeyed SIGTERM, the child needed the SIGKILL after 1 s


def test_the_watchdog_stops_the_group_once_its_launcher_closes_the_pipe() -> None:
    leader = subprocess.Popen(
        child_programs.argv("stubborn-tree"), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    watchdog = subprocess.Popen([sys.executable, "-I", str(WATCHDOG)], stdin=subprocess.PIPE, text=True)
    try:
        assert leader.stdout is not None and watchdog.stdin is not None
        child_pid = int(leader.stdout.readline())
        watchdog.stdin.write(f"{leader.pid} 1.0\n")
        watchdog.stdin.flush()
        with pytest.raises(subprocess.TimeoutExpired):
            watchdog.wait(timeout=0.5)  # it waits while the pipe is open
        assert sorted(live_group_members(leader.pid)) == sorted([leader.pid, child_pid])
        started = time.monotonic()
        watchdog.stdin.close()  # what the launcher's death does too
        assert watchdog.wait(timeout=10) == 0
        elapsed_s = time.monotonic() - started
        leader.wait(timeout=10)
        assert wait_until_group_gone(leader.pid, timeout_s=5) == []
        assert 1.0 <= elapsed_s < 5.0  # the child ignored SIGTERM and needed the SIGKILL after the 1 s grace
    finally:
        leader.kill()
        leader.wait(timeout=10)
        watchdog.kill()
        watchdog.wait(timeout=10)


@pytest.mark.engine
def test_service_runs_on_the_real_engine_and_streams_a_token_id_prompt(start_engine, tiny_model_dir: Path) -> None:
    engine = start_engine()
    assert engine.argv[0] == str(engine_python())
    assert engine.base_url == f"http://127.0.0.1:{engine.port}"
    body = {"model": option_value(engine.argv, "--model"), "prompt": [11, 22, 33, 44, 55],
            "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{engine.base_url}/v1/completions", json=body, headers=auth_headers(),
                      timeout=60) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    usage = chunks[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (5, 6)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    # The tiny model's chat template renders Qwen's turn markers, and the engine counts exactly those tokens.
    chat = httpx.post(f"{engine.base_url}/v1/chat/completions", timeout=60, headers=auth_headers(), json={
        "model": body["model"], "messages": [{"role": "user", "content": "How long is the queue?"}],
        "max_tokens": 2, "temperature": 0})  # fmt: skip
    assert chat.status_code == 200, chat.text
    rendered = "<|im_start|>user\nHow long is the queue?<|im_end|>\n<|im_start|>assistant\n"
    expected_prompt_tokens = len(Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode(rendered).ids)
    assert chat.json()["usage"]["prompt_tokens"] == expected_prompt_tokens
    # The preset's 4 MiB at 1,024 bytes per token (2 x 4 layers x 2 heads x 32 x 2 bytes) is 4,096 tokens.
    assert "CPU KV cache size: 4,096 tokens" in engine.log_path.read_text()


@pytest.mark.engine
@pytest.mark.parametrize(
    ("params", "engine_says"),
    [
        # an allow-listed flag with a value only the engine can refuse
        ({"extra_args": "--quantization no-such-method"}, r"Unknown quantization method: no-such-method"),
        ({"model": "/nonexistent/tiny-model"}, r"Error: .*'/nonexistent/tiny-model'"),
        # 1 MiB = 1,024 tokens = 8 blocks of 128, one reserved: 896 tokens, less than one 2,048-token request.
        ({"kv_cache_memory_bytes": 1_048_576, "max_model_len": 2048},
         r"ValueError: .*estimated maximum model length is 896"),
    ],
    ids=["bad-argument", "missing-model-directory", "kv-cache-too-small"],
)
def test_engine_start_failures_end_promptly_with_the_engine_error(
    tiny_model_dir: Path, tmp_path: Path, params: dict, engine_says: str
) -> None:
    started = time.monotonic()
    with (
        pytest.raises(HarnessError, match=r"engine exited with code [1-9]\d* before it was healthy: ") as failure,
        local_cpu_engine(tiny_model_dir, tmp_path / "engine.log", health_timeout_s=600, **params),
    ):
        pytest.fail("the engine should not have become healthy")
    assert failure.match(engine_says)
    assert time.monotonic() - started < 240  # well before the 600 s health deadline: exit was noticed


@pytest.mark.engine
@pytest.mark.parametrize("caller_signal", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_engine_process_outlives_a_killed_caller(tiny_model_dir: Path, tmp_path: Path, caller_signal) -> None:
    caller = subprocess.Popen(child_programs.argv("engine-caller", str(tiny_model_dir), str(tmp_path / "e.log")),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout is not None
        line = caller.stdout.readline()
        engine_pid = json.loads(line)["pid"]
        assert len(live_group_members(engine_pid)) >= 3  # API server, engine core, worker
        caller.send_signal(caller_signal)
        caller.wait(timeout=60)
        assert wait_until_group_gone(engine_pid, timeout_s=60) == []
    finally:
        caller.kill()
        caller.wait(timeout=30)
