"""Secrets are masked in every shape the harness meets them in, and nothing else is touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import redact
from harness.errors import HarnessError
from harness.launch.experiment import engine_limits, write_engine_record
from harness.observe.server_logs import parse_startup_log
from harness.redact import (
    is_secret_name,
    redact_argv,
    redact_file,
    redact_text,
    redact_url,
    refuse_url_credentials,
    secret_free,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ARGS_0_11 = FIXTURES / "logs" / "vllm-0.11.2" / "kv-cache-memory-bytes-qwen3-4b.log"


@pytest.fixture(autouse=True)
def nothing_met_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no remembered secret and none in the environment."""
    monkeypatch.setattr(redact, "_met", set())
    for name in ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("argv", "masked"), [
    (["--api-key", "sk-abcdefgh", "--model", "m"], ["--api-key", "***", "--model", "m"]),
    (["--api-key=sk-abcdefgh", "--port", "8000"], ["--api-key=***", "--port", "8000"]),
    (["--api-key", "first-key-1", "second-key-2", "--enforce-eager"], ["--api-key", "***", "***", "--enforce-eager"]),
    (["--hf-token", "hf_abcdefghij"], ["--hf-token", "***"]),
    (["--hf-token", "--model", "m"], ["--hf-token", "--model", "m"]),  # a bare flag: use the cached token
    (["--s3-secret-access-key", "x", "--db-password=y"], ["--s3-secret-access-key", "***", "--db-password=***"]),
    (["--max-num-batched-tokens", "8192", "--tokenizer", "t", "--long-prefill-token-threshold", "4"],
     ["--max-num-batched-tokens", "8192", "--tokenizer", "t", "--long-prefill-token-threshold", "4"]),
    (["--base-url", "http://user:pa55word@host:8000/v1"], ["--base-url", "http://user:***@host:8000/v1"]),
])
def test_argv_secret_option_values_are_masked_and_nothing_else(argv: list[str], masked: list[str]) -> None:
    assert redact_argv(argv) == masked


def test_a_value_masked_in_argv_is_masked_wherever_it_appears_later() -> None:
    redact_argv(["python", "-m", "vllm", "--api-key", "canary-0123456789"])
    echoed = "api_server.py: error: unrecognized arguments: canary-0123456789"
    assert redact_text(echoed) == "api_server.py: error: unrecognized arguments: ***"


def test_a_secret_named_environment_variable_is_masked_in_any_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "env-key-0123456789")
    assert redact_text("request with env-key-0123456789 failed") == "request with *** failed"


@pytest.mark.parametrize(("line", "masked"), [
    # vLLM 0.10.0 (tests/fixtures/field/cases/v0100-...yaml): the key as a string
    ("INFO 08-18 19:56:47 [cli_args.py:261] non-default args: {'host': '0.0.0.0', 'port': 8003, "
     "'api_key': 'anton-vllm-key', 'max_model_len': 2048}",
     "INFO 08-18 19:56:47 [cli_args.py:261] non-default args: {'host': '0.0.0.0', 'port': 8003, "
     "'api_key': '***', 'max_model_len': 2048}"),
    # vLLM 0.11: --api-key takes several keys, logged as a list
    ("\x1b[1;36m(APIServer pid=11)\x1b[0;0m INFO 11-29 11:00:00 [utils.py:233] non-default args: "
     "{'model': 'Qwen/Qwen3-4B', 'api_key': ['key-one-1234', 'key-two-5678'], 'hf_token': 'hf_abcdefgh'}",
     "\x1b[1;36m(APIServer pid=11)\x1b[0;0m INFO 11-29 11:00:00 [utils.py:233] non-default args: "
     "{'model': 'Qwen/Qwen3-4B', 'api_key': ['***'], 'hf_token': '***'}"),
    # vLLM 0.32 masks its own: left as it is
    ("(APIServer pid=1) INFO 11-29 15:47:03 [api_utils.py:286] non-default args: {'model': 'm', 'api_key': '***'}",
     "(APIServer pid=1) INFO 11-29 15:47:03 [api_utils.py:286] non-default args: {'model': 'm', 'api_key': '***'}"),
    ('{"api_key": "json-key-1234", "kv_bytes_per_token": 36864, "max_tokens": 8}',
     '{"api_key": "***", "kv_bytes_per_token": 36864, "max_tokens": 8}'),
    ("curl -H 'Authorization: Bearer sk-0123456789' http://h:8000/v1/models",
     "curl -H 'Authorization: Bearer ***' http://h:8000/v1/models"),
    ("exec python3 -m vllm.entrypoints.openai.api_server --api-key sekrit --model /m",
     "exec python3 -m vllm.entrypoints.openai.api_server --api-key *** --model /m"),
    ("VLLM_API_KEY=abc123 HF_TOKEN=None vllm serve m", "VLLM_API_KEY=*** HF_TOKEN=None vllm serve m"),
    ("ValueError: bad config hf_token='hf_abcdefgh', tokenizer='t'", "ValueError: bad config hf_token='***', "
     "tokenizer='t'"),
    ("proxy https://svc:hunter2@proxy.local:3128 refused", "proxy https://svc:***@proxy.local:3128 refused"),
    # argparse's usage names the option's metavar, and a switch's alternatives: no secret there
    ("usage: api_server.py [--api-key API_KEY [API_KEY ...]] [--allow-credentials | --no-allow-credentials]",
     "usage: api_server.py [--api-key API_KEY [API_KEY ...]] [--allow-credentials | --no-allow-credentials]"),
])
def test_log_and_text_shapes_are_masked(line: str, masked: str) -> None:
    assert redact_text(line) == masked


def test_real_logs_without_secrets_pass_through_unchanged() -> None:
    logs = list((FIXTURES / "logs").rglob("*.log"))
    assert len(logs) >= 10
    for path in logs:
        text = path.read_text(encoding="utf-8")
        assert redact_text(text) == text, path


def test_a_logged_key_leaves_the_other_args_readable_and_the_failure_masked() -> None:
    """The args dict still parses once its key is masked; an error line quoting the key later is masked too."""
    lines = ARGS_0_11.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1].replace("'max_model_len': 8192", "'max_model_len': 8192, 'api_key': ['log-canary-2718']")
    lines.append("(EngineCore_DP0 pid=22) ERROR 11-29 11:00:30 [core.py:708] EngineCore failed to start.")
    lines.append("(EngineCore_DP0 pid=22) ERROR 11-29 11:00:30 [core.py:708] ValueError: key log-canary-2718 refused")
    parsed = parse_startup_log("\n".join(lines))
    assert parsed.non_default_args is not None and parsed.non_default_args["max_model_len"] == 8192
    assert parsed.non_default_args["api_key"] == ["***"]
    assert "log-canary-2718" not in parsed.model_dump_json()
    assert parsed.failure is not None and parsed.failure.error == "ValueError: key *** refused"


def test_names_of_secrets() -> None:
    secret = ["--api-key", "api_key", "--hf-token", "VLLM_API_KEY", "HF_TOKEN", "--db-password", "client_secret",
              "s3_access_key_id", "POLYAXON_AUTH_TOKEN"]
    plain = ["--max-num-batched-tokens", "--tokenizer", "max_tokens", "kv_bytes_per_token", "per_token",
             "--ssl-keyfile", "--allow-credentials", "--dbo-decode-token-threshold", "prompt_tokens", ""]
    assert [name for name in secret if not is_secret_name(name)] == []
    assert [name for name in plain if is_secret_name(name)] == []


def test_limits_and_inputs_lose_their_secrets() -> None:
    assert secret_free({"api_key": "k", "max_num_seqs": 8, "model": "http://u:pw-12345@h/m"}) == {
        "max_num_seqs": 8, "model": "http://u:***@h/m"}
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--api-key", "limit-canary", "--max-num-seqs", "4"]
    assert engine_limits(argv) == {"max_num_seqs": 4}


def test_engine_json_keeps_the_command_line_with_its_key_masked(tmp_path: Path) -> None:
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--api-key=engine-canary-1", "--max-num-seqs", "4"]
    write_engine_record(tmp_path, argv=argv, limits={"api_key": "engine-canary-1", "max_num_seqs": 4})
    text = (tmp_path / "engine.json").read_text()
    assert "engine-canary-1" not in text
    assert json.loads(text)["argv"][3:] == ["--api-key=***", "--max-num-seqs", "4"]
    assert json.loads(text)["limits"] == {"max_num_seqs": 4}


def test_a_file_is_masked_in_place_and_its_other_bytes_kept(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"\xff not utf-8\n'api_key': 'file-canary-1'\n")
    redact_file(log)
    assert log.read_bytes() == b"\xff not utf-8\n'api_key': '***'\n"


def test_a_url_with_user_info_is_refused_in_one_line_without_its_password() -> None:
    assert redact_url("http://u:pw@127.0.0.1:8000") == "http://u:***@127.0.0.1:8000"
    with pytest.raises(HarnessError) as refused:
        refuse_url_credentials("http://u:url-canary@127.0.0.1:8000", "--base-url")
    assert str(refused.value) == ("--base-url http://***@127.0.0.1:8000: holds user info; put the engine's key in "
                                  "VLLM_API_KEY and give the URL without it")
    with pytest.raises(HarnessError, match=r"^--server http://\*\*\*@h:1/v1: holds user info"):
        refuse_url_credentials("http://token-only-canary@h:1/v1", "--server")
    refuse_url_credentials("http://127.0.0.1:8000", "--base-url")  # no user info: accepted
