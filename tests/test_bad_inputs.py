"""Bad input ends with one line naming the file, option or value and exit code 2; legal but suspect input
runs with a warning. One table, each row the command a user typed and the line it must print."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = str(ROOT / "prompts" / "tiny-qwen3-600x8")
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there


class NotVllm(BaseHTTPRequestHandler):
    """A server that is up but is not vLLM: /health answers `health_status`, every other path 404."""

    health_status = 200

    def do_GET(self) -> None:
        self.send_response(self.health_status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def not_vllm(health_status: int) -> Iterator[str]:
    handler = type("Answering", (NotVllm,), {"health_status": health_status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "empty.metrics").write_text("")
    (tmp_path / "other.metrics").write_text("# TYPE process_open_fds gauge\nprocess_open_fds 34.0\n")
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "config.json").write_text('{"run_id": "0123abcd"}')
    (tmp_path / "swept").mkdir()
    (tmp_path / "swept" / "sweep.json").write_text("{}")
    (tmp_path / "points" / "point-0").mkdir(parents=True)
    (tmp_path / "points" / "point-0" / "stdout.log").write_text("")
    (tmp_path / "job.yaml").write_text("kind: component\nrun:\n  kind: job\n  container:\n    image: local\n"
                                       "    command: [harness, run]\n")
    return {"a_file": tmp_path / "a-file", "empty": tmp_path / "empty.metrics", "other": tmp_path / "other.metrics",
            "held": tmp_path / "held", "swept": tmp_path / "swept", "points": tmp_path / "points",
            "job": tmp_path / "job.yaml"}


def run_args(out: str, *options: str, base_url: str = UNREACHABLE) -> list[str]:
    return ["run", "--inventory", INVENTORY, "--out", out, "--base-url", base_url, "--concurrency", "2", *options]


BAD_INPUTS = [
    ("run-out-is-a-file", lambda f: run_args(str(f["a_file"])),
     "error: --out {a_file}: is a file, not a run directory"),
    ("run-out-holds-a-run", lambda f: run_args(str(f["held"])),
     "error: --out {held}: already holds run 0123abcd (config.json); give a new directory, or --force to move the "
     "old run aside"),
    ("report-out-is-a-file",
     lambda f: ["report", "--runs", str(f["held"]), "--limit", "max_num_seqs", "--out", str(f["a_file"])],
     "error: --out {a_file}: is a file; the report needs a directory"),
    ("empty-metrics-file", lambda f: ["capacity", "--metrics", str(f["empty"])],
     "error: --metrics {empty}: empty; expected a vLLM /metrics scrape"),
    ("metrics-without-vllm", lambda f: ["capacity", "--metrics", str(f["other"])],
     "error: --metrics {other}: no vLLM metric in it; expected a vLLM /metrics scrape"),
    ("sweep-out-holds-a-sweep",
     lambda f: ["sweep", "-f", str(ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml"), "--local", "--out",
                str(f["swept"])],
     "error: --out {swept}: already holds a sweep ({swept}/sweep.json); give a new directory"),
    ("run-local-out-used", lambda f: ["run-local", "-f", str(f["job"]), "--out", str(f["points"])],
     "error: --out {points}: an earlier run's outputs are in point-0; give a new directory"),
    ("error-fraction-above-1", lambda f: run_args(str(f["held"]) + "-new", "--max-error-fraction", "1.5"),
     "error: --max-error-fraction: Input should be less than or equal to 1, not 1.5"),
    ("negative-read-timeout", lambda f: run_args(str(f["held"]) + "-new", "--read-timeout-s", "-1"),
     "error: --read-timeout-s must be a positive number of seconds, not -1.0"),
    ("nan-stall-timeout", lambda f: run_args(str(f["held"]) + "-new", "--stall-timeout-s", "nan"),
     "error: --stall-timeout-s: must be a finite number, not nan"),
]


@pytest.mark.parametrize(("build", "message"), [row[1:] for row in BAD_INPUTS], ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_code_2(files: dict[str, Path], build, message: str) -> None:
    result = CliRunner().invoke(app, build(files))
    assert result.exit_code == 2, result.output
    assert result.output.strip() == message.format(**files)


@pytest.mark.parametrize(("health_status", "refusal"), [
    (200, "GET /v1/models gave no model (HTTP 404): not a vLLM server"),
    (404, "answers GET /health with 404: not a vLLM server"),
])
def test_a_server_that_is_not_vllm_is_refused_at_once(tmp_path: Path, health_status: int, refusal: str) -> None:
    with not_vllm(health_status) as base_url:
        started = time.monotonic()
        result = CliRunner().invoke(app, run_args(str(tmp_path / "run"), "--ready-timeout-s", "600",
                                                  base_url=base_url))
    assert result.exit_code == 2 and time.monotonic() - started < 10  # not the 600 s ready wait
    assert result.output.strip().splitlines()[-1] == f"error: server {base_url}: {refusal}"
    assert not (tmp_path / "run" / "requests.jsonl").exists()


def test_a_silent_port_says_what_the_ready_wait_waits_for(tmp_path: Path) -> None:
    silent = CliRunner().invoke(app, run_args(str(tmp_path / "run"), "--ready-timeout-s", "1"))
    assert silent.exit_code == 2
    first, *_, last = silent.output.strip().splitlines()
    assert first.startswith(f"waiting for {UNREACHABLE}/health: 0 of 1 s (")
    assert last.startswith(f"error: server {UNREACHABLE} not ready (GET /health: ") and last.endswith("within 1 s")


def test_token_ids_beyond_the_tokenizer_are_refused_and_special_ids_warned(tiny_model_dir: Path, tmp_path: Path):
    build = ["prompts", "build", "token-ids", "--prompt-tokens", "8", "--output-cap-tokens", "4",
             "--tokenizer", str(tiny_model_dir)]
    beyond = CliRunner().invoke(app, [*build[:3], str(tmp_path / "a"), *build[3:], "--vocab-high", "200000"])
    assert beyond.exit_code == 2
    # The tiny tokenizer: 2,045 byte-level ids, then <|endoftext|>, <|im_start|>, <|im_end|> at 2045-2047.
    assert beyond.output.strip() == (f"error: --vocab-high 200000: tokenizer {tiny_model_dir} has 2,048 ids "
                                     "(0 to 2047); give at most 2048")
    assert not (tmp_path / "a").exists()
    special = CliRunner().invoke(app, [*build[:3], str(tmp_path / "b"), *build[3:], "--vocab-high", "2048"])
    assert special.exit_code == 0, special.output
    assert (f"warning: ids 2045,2046,2047 in [0, 2048) are tokenizer {tiny_model_dir}'s special tokens; add them "
            "to --exclude-ids unless that is meant") in special.output
    clean = CliRunner().invoke(app, [*build[:3], str(tmp_path / "c"), *build[3:], "--vocab-high", "2045"])
    assert clean.exit_code == 0 and "warning" not in clean.output
