"""Bad input ends with one line naming the file, option or value and exit code 2; legal but suspect input
runs with a warning. One table, each row the command a user typed and the line it must print."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from harness.cli import app

from run_records import BASE_LIMITS, write_run

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
    (tmp_path / "damaged.log").write_text("INFO 11-29 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: "
                                          + "9" * 400 + " tokens\n")
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
            "job": tmp_path / "job.yaml", "damaged": tmp_path / "damaged.log"}


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
    ("log-figure-of-400-digits", lambda f: ["capacity", "--log", str(f["damaged"])],
     "error: --log {damaged}: log figure 99999999999999999999… (400 characters) is larger than any vLLM prints: "
     "the log is damaged or edited"),
    ("sweep-out-holds-a-sweep",
     lambda f: ["sweep", "-f", str(ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml"), "--local", "--out",
                str(f["swept"])],
     "error: --out {swept}: already holds a sweep ({swept}/sweep.json); give a new directory"),
    ("run-local-out-used", lambda f: ["run-local", "-f", str(f["job"]), "--out", str(f["points"])],
     "error: --out {points}: an earlier run's outputs are in point-0; give a new directory"),
    ("error-fraction-above-1", lambda f: run_args(str(f["held"]) + "-new", "--max-error-fraction", "1.5"),
     "error: --max-error-fraction: Input should be less than or equal to 1, not 1.5"),
    ("negative-read-timeout", lambda f: run_args(str(f["held"]) + "-new", "--read-timeout-s", "-1"),
     "error: --read-timeout-s: must be a positive number of seconds, not -1.0"),
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


def test_token_ids_beyond_the_tokenizer_are_refused_and_special_ids_warned(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
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


# --- Every bad input answered, by class: each class a list of commands × options × bad values. -------------

SWEEP = str(ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml")
SERVICE = str(ROOT / "polyaxonfiles" / "vllm-service.yaml")
CORPUS = str(ROOT / "harness" / "corpus" / "kitchen.txt")
SERVICE_UUID = "0123456789abcdef0123456789abcdef"
BASES = {  # words that make each command valid, so the refusal seen is the one of the option under test
    "run": ["run", "--inventory", INVENTORY, "--out", "{tmp}/run", "--base-url", UNREACHABLE, "--concurrency", "2",
            "--ready-timeout-s", "2"],
    "run --rate": ["run", "--inventory", INVENTORY, "--out", "{tmp}/run", "--base-url", UNREACHABLE, "--rate", "2",
                   "--ready-timeout-s", "2"],
    "run --service-uuid": ["run", "--inventory", INVENTORY, "--out", "{tmp}/run", "--base-url", UNREACHABLE,
                           "--service-uuid", SERVICE_UUID, "--concurrency", "2", "--ready-timeout-s", "2"],
    "prompts verify": ["prompts", "verify", INVENTORY],
    "prompts reuse": ["prompts", "reuse", INVENTORY, "--block-size", "16"],
    "prompts build token-ids": ["prompts", "build", "token-ids", "{tmp}/inventory", "--vocab-high", "100",
                                "--prompt-tokens", "8", "--output-cap-tokens", "4"],
    "prompts build token-ids --prefix-groups": [
        "prompts", "build", "token-ids", "{tmp}/inventory", "--vocab-high", "100", "--prompt-tokens", "8",
        "--output-cap-tokens", "4", "--prefix-groups", "2", "--prompts-per-group", "2", "--shared-prefix-tokens", "4"],
    "prompts build conversations": ["prompts", "build", "conversations", "{tmp}/inventory", "--vocab-high", "100",
                                    "--conversations", "2", "--turns", "2", "--user-tokens", "8",
                                    "--assistant-tokens", "4", "--output-cap-tokens", "4"],
    "prompts build text": ["prompts", "build", "text", "{tmp}/inventory", "--corpus", CORPUS, "--tokenizer", "{tiny}",
                           "--prompt-tokens", "8", "--output-cap-tokens", "4"],
    "serve": ["serve", "-f", SERVICE, "--log", "{tmp}/engine.log"],
    "run-local": ["run-local", "-f", "{tmp}/job.yaml", "--out", "{tmp}/points", "--offline-root", "{tmp}/offline"],
    "sweep": ["sweep", "-f", SWEEP, "--local", "-P", "concurrency=2", "--out", "{tmp}/sweep"],
    "sweep on polyaxon": ["sweep", "-f", SWEEP, "--project", "acme/serving", "-P", "concurrency=2", "--out",
                          "{tmp}/sweep"],
    "report": ["report", "--runs", "{tmp}/runs", "--limit", "max_num_seqs", "--out", "{tmp}/report"],
    "search --base-url": ["search", "--base-url", UNREACHABLE, "--inventory", INVENTORY, "--high", "2",
                          "--slo-ttft-ms-p99", "100", "--out", "{tmp}/search"],
    "demo": ["demo", "--out", "{tmp}/demo"],
    "emulate": ["emulate", "--port", "{held_port}"],  # a port held by the test: an emulator let through cannot stay
}
NUMBERS = [  # (base, option, values nonsense for what the option counts); NaN and infinity: test_bad_input_classes
    ("run", "--concurrency", ["0", "-1"]), ("run", "--max-tokens", ["0", "-1"]), ("run", "--requests", ["0", "-1"]),
    ("run", "--duration-s", ["0", "-1"]), ("run", "--warmup", ["-1"]), ("run", "--seed", ["-1"]),
    ("run", "--temperature", ["-1", "-0.5"]), ("run", "--slo-ttft-ms", ["0", "-5"]),
    ("run", "--slo-tpot-ms", ["0", "-5"]), ("run", "--sample-interval-s", ["0", "-1"]),
    ("run", "--max-dispatch-lag-ms", ["0", "-1"]), ("run", "--max-error-fraction", ["-0.1", "1.5"]),
    ("run", "--read-timeout-s", ["0", "-1"]), ("run", "--stall-timeout-s", ["0", "-1"]),
    ("run", "--ready-timeout-s", ["0", "-1"]), ("run --rate", "--rate", ["0", "-1"]),
    ("run --rate", "--burstiness", ["0", "-1"]), ("run --rate", "--max-concurrency", ["0", "-1"]),
    ("run --service-uuid", "--service-port", ["0", "-1", "65536"]),
    ("prompts verify", "--max-model-len", ["0", "-1"]),
    ("prompts reuse", "--block-size", ["0", "-1"]), ("prompts reuse", "--cache-blocks", ["0", "-1"]),
    ("prompts build token-ids", "--count", ["0", "-1", "1048577"]), ("prompts build token-ids", "--seed", ["-1"]),
    ("prompts build token-ids", "--vocab-high", ["0", "-1", "16777217"]),
    ("prompts build token-ids", "--vocab-low", ["-1"]), ("prompts build token-ids", "--shared-prefix-tokens", ["-1"]),
    ("prompts build token-ids", "--prompt-tokens", ["0", "16777217", "99999999999"]),
    ("prompts build token-ids", "--output-cap-tokens", ["0", "16777217"]),
    ("run", "--think-time-s", ["-1"]),
    ("prompts build token-ids --prefix-groups", "--prefix-groups", ["0", "-1", "1048577"]),
    ("prompts build token-ids --prefix-groups", "--prompts-per-group", ["0", "-1"]),
    ("prompts build token-ids --prefix-groups", "--shared-prefix-tokens", ["0"]),
    ("prompts build conversations", "--conversations", ["0", "-1"]),
    ("prompts build conversations", "--output-cap-tokens", ["0", "16777217"]),
    ("prompts build conversations", "--seed", ["-1"]), ("prompts build conversations", "--vocab-high", ["0", "-1"]),
    ("prompts build text", "--count", ["0", "1048577"]), ("prompts build text", "--seed", ["-1"]),
    ("prompts build text", "--prompt-tokens", ["0", "16777217"]),
    ("serve", "--port", ["0", "-1", "65536"]), ("serve", "--health-timeout-s", ["0", "-1"]),
    ("sweep", "--running-deadline-s", ["0", "-1"]), ("sweep", "--harness-deadline-s", ["0", "-1"]),
    ("report", "--api-limit", ["0", "-1"]), ("demo", "--repeats", ["0", "-1"]),
]
WORDS = [  # (base, option, values): names and ids that are empty, span lines, or have no shape Polyaxon accepts
    ("run", "--project", ["", "a\nb", "a/b/c", "owner/"]),
    ("run --service-uuid", "--service-uuid", ["", "a\nb", "not-a-uuid"]),
    ("run-local", "--project", ["", "a\nb", "a b"]),
    ("sweep on polyaxon", "--project", ["", "a\nb", "a/b/c"]), ("sweep", "--queue", ["", "a\nb", "a/b/c"]),
    ("report", "--project", ["", "a\nb", "owner/"]), ("report", "--query", ["", " "]),
    ("prompts build token-ids", "--name", ["", "a\nb", "a b", "..", "a/b"]),
    ("prompts build token-ids", "--salt", ["", "a\nb"]), ("prompts build token-ids", "--tokenizer", ["", " "]),
    ("prompts build conversations", "--salt", ["", "a\nb"]), ("prompts build conversations", "--name", ["", "a\nb"]),
    ("prompts build conversations", "--turns", ["", "x", "0", "3-1", "1-"]),
    ("prompts build conversations", "--user-tokens", ["", "1.5", "-4", "16777217"]),
    ("prompts build text", "--name", ["", "a\nb"]), ("prompts build text", "--tokenizer", ["", "a\nb"]),
    ("prompts build text", "--revision", ["", "a\nb"]), ("emulate", "--model", ["", "a\nb"]),
]
LISTS = [  # (base, option, values): comma-separated integers that are not, or not in range
    (base, option, ["x", "1,,2", "1e3", "1_000", "\uff11\uff12", "8,\n", "-1"])
    for base, option in (("prompts build token-ids", "--prompt-tokens"), ("prompts build token-ids", "--exclude-ids"),
                         ("prompts build token-ids", "--output-cap-tokens"), ("prompts build text", "--prompt-tokens"),
                         ("prompts build text", "--output-cap-tokens"))
]
BAD_URLS = ["", "not-a-url", "127.0.0.1:9", "ftp://127.0.0.1:9", "http://", "http://:9", "http://127.0.0.1:0",
            "http://127.0.0.1:65536", "http://127.0.0.1:99999", "http://127.0.0.1:-1", "http://127.0.0.1:abc",
            "http://\uff11\uff12\uff17.0.0.1:9", "http://127.0.0.1:9/?q=1", "http://127.0.0.1:9/#top",
            "http://127.0.0.1:9\n", "http://127.0.0.1 :9", "http://127..0.1:9"]
URLS = [("run", "--base-url", BAD_URLS), ("search --base-url", "--base-url", BAD_URLS),
        ("prompts verify", "--server", BAD_URLS)]


def cases(table: list[tuple[str, str, list[str]]]) -> list[Any]:
    return [pytest.param(base, option, value, id=f"{base} {option} {value!r}")
            for base, option, values in table for value in values]


def command_of(base: str) -> Any:
    """The click command a base's words name: 'prompts build text' → that leaf."""
    command: Any = typer.main.get_command(app)
    for word in BASES[base]:
        if not getattr(command, "commands", None):
            break
        command = command.commands[word]
    return command


def tree(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(path.relative_to(folder)), path.stat().st_size if path.is_file() else -1)
                  for path in folder.rglob("*"))


@pytest.fixture
def work(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
         tiny_model_dir: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """The folder every case may write in (and must not); no engine and no Polyaxon API can be reached."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "job.yaml").write_text("kind: component\nrun:\n  kind: job\n  container:\n    image: local\n"
                                       "    command: [harness, run]\n")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # a default relative output lands in the watched tree
    monkeypatch.setenv("HARNESS_ENGINE_VENV", str(tmp_path_factory.mktemp("no-engine")))
    monkeypatch.setenv("POLYAXON_HOST", UNREACHABLE)
    monkeypatch.setenv("VLLM_API_KEY", "bad-inputs-test-key")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    request.addfinalizer(held.close)
    return {"tmp": str(tmp_path), "tiny": str(tiny_model_dir), "held_port": str(held.getsockname()[1])}


def with_option(base: str, option: str, value: str, values: dict[str, str]) -> list[str]:
    """The base's words with `option` given last (a later value wins), formatted for this test's folder."""
    return [word.format(**values) for word in BASES[base]] + [option, value]


def assert_refused(args: list[str], folder: Path, *named: str) -> str:
    """Exit code 2, exactly one line `error: ...` naming each of `named`, and nothing under `folder` changed."""
    before = tree(folder)
    result = CliRunner().invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and all(name in lines[0] for name in named), lines[0]
    assert tree(folder) == before
    return lines[0]


@pytest.mark.parametrize(("base", "option"), [(base, option) for table in (NUMBERS, WORDS, LISTS, URLS)
                                              for base, option, _ in table])
def test_every_option_in_the_tables_is_an_option_of_its_command(base: str, option: str) -> None:
    assert option in {opt for param in command_of(base).params for opt in param.opts}


@pytest.mark.parametrize(("base", "option", "value"), cases(NUMBERS))
def test_a_number_out_of_its_range_is_refused_naming_the_option(work: dict[str, str], base: str, option: str,
                                                                value: str) -> None:
    assert_refused(with_option(base, option, value, work), Path(work["tmp"]), option)


@pytest.mark.parametrize(("base", "option", "value"), cases(WORDS))
def test_a_name_that_is_empty_or_malformed_is_refused_naming_the_option(work: dict[str, str], base: str,
                                                                        option: str, value: str) -> None:
    assert_refused(with_option(base, option, value, work), Path(work["tmp"]), option)


@pytest.mark.parametrize(("base", "option", "value"), cases(LISTS))
def test_a_list_of_integers_that_is_not_one_is_refused_naming_the_option(work: dict[str, str], base: str,
                                                                         option: str, value: str) -> None:
    assert_refused(with_option(base, option, value, work), Path(work["tmp"]), option)


@pytest.mark.parametrize(("base", "option", "value"), cases(URLS))
def test_a_url_that_cannot_name_a_server_is_refused_before_any_wait(work: dict[str, str], base: str, option: str,
                                                                    value: str) -> None:
    line = assert_refused(with_option(base, option, value, work), Path(work["tmp"]), option)
    assert "waiting" not in line and "not ready" not in line


def crlf(inventory: Path, file: str) -> None:
    (inventory / file).write_bytes((inventory / file).read_bytes().replace(b"\n", b"\r\n"))


def nest_first_line(inventory: Path, file: str) -> None:
    lines = (inventory / file).read_text().split("\n")
    (inventory / file).write_text("\n".join(["[" * 100_000 + "]" * 100_000, *lines[1:]]))


INVENTORY_DAMAGE = {  # damage → (what it does to the inventory, the file and words the refusal names)
    "prompts.jsonl in CRLF": (lambda inventory: crlf(inventory, "prompts.jsonl"),
                              ("prompts.jsonl line 1", "carriage return")),
    "manifest.json in CRLF": (lambda inventory: crlf(inventory, "manifest.json"),
                              ("manifest.json line 1", "carriage return")),
    "a prompt nested too deep": (lambda inventory: nest_first_line(inventory, "prompts.jsonl"),
                                 ("prompts.jsonl line 1", "nested too deep")),
    "a manifest nested too deep": (lambda inventory: nest_first_line(inventory, "manifest.json"),
                                   ("manifest.json", "nested too deep")),
}
INVENTORY_USERS = {"prompts verify": lambda inventory: ["prompts", "verify", inventory],
                   "run": lambda inventory: [*BASES["run"][:1], "--inventory", inventory, *BASES["run"][3:]]}


@pytest.mark.parametrize("damage", list(INVENTORY_DAMAGE))
@pytest.mark.parametrize("command", list(INVENTORY_USERS))
def test_a_damaged_inventory_is_refused_naming_file_and_line(work: dict[str, str], command: str, damage: str) -> None:
    inventory = Path(work["tmp"]) / "inventory"
    shutil.copytree(INVENTORY, inventory)
    assert CliRunner().invoke(app, ["prompts", "verify", str(inventory)]).exit_code == 0  # intact before
    harm, (where, words) = INVENTORY_DAMAGE[damage]
    harm(inventory)
    args = [word.format(**work) for word in INVENTORY_USERS[command](str(inventory))]
    assert_refused(args, Path(work["tmp"]), f"{inventory}/{where}", words)


ESCAPES = ["prompts/../prompts/tiny-qwen3-600x8", "prompts/tiny-qwen3-600x8/../tiny-qwen3-600x8"]


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize("command", list(INVENTORY_USERS))
def test_an_inventory_addressed_as_prompts_never_leaves_the_folder(work: dict[str, str], monkeypatch, command: str,
                                                                   path: str) -> None:
    monkeypatch.chdir(ROOT)
    assert (ROOT / path / "manifest.json").is_file()  # the path exists: only the '..' is refused
    args = [word.format(**work) for word in INVENTORY_USERS[command](path)]
    assert_refused(args, Path(work["tmp"]), path, "'..'")


CORPORA = {  # a --corpus that is not prose: what it holds, and a word the refusal says
    "binary": (b"\x00\xff\xfe\x89PNG" * 64, "not UTF-8"),
    "UTF-16": ("soup of the day ".encode("utf-16") * 8, "not UTF-8"),
    "NUL bytes in UTF-8": (b"soup \x00 of the day " * 64, "control character"),
    # a leading one is an editor's and is dropped on reading; one inside the text is no prose
    "a byte-order mark": (b"soup of the day " * 32 + b"\xef\xbb\xbf" + b"soup of the day " * 32, "byte-order mark"),
    "a JSON object": (b'{"text": "soup of the day", "id": 1}', "JSON with keys 'text', 'id'"),
    "JSON lines": (b'{"prompt": "soup"}\n{"prompt": "day"}\n', "JSON with keys 'prompt'"),
    "a JSON list": (b'["soup", "day"]', "JSON"),
    "brackets nested past any parser": (b"[" * 100_000 + b"]" * 100_000, "JSON"),
}


@pytest.mark.parametrize("kind", list(CORPORA))
def test_a_corpus_that_is_not_prose_is_refused_before_anything_is_built(work: dict[str, str], kind: str) -> None:
    corpus = Path(work["tmp"]) / "corpus.txt"
    corpus.write_bytes(CORPORA[kind][0])
    args = with_option("prompts build text", "--corpus", str(corpus), work)
    assert_refused(args, Path(work["tmp"]), f"--corpus {corpus}", CORPORA[kind][1])


def cut_a_middle_line(run_dir: Path) -> None:
    lines = (run_dir / "requests.jsonl").read_text().split("\n")
    lines[2] = lines[2][:40]
    (run_dir / "requests.jsonl").write_text("\n".join(lines))


def set_run_id(run_dir: Path, run_id: str) -> None:
    for name in ("config.json", "summary.json"):
        record = json.loads((run_dir / name).read_text())
        (run_dir / name).write_text(json.dumps({**record, "run_id": run_id}))


def stamp_first_sample(run_dir: Path, t_s: float) -> None:
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "t_s": t_s})
    (run_dir / "samples.jsonl").write_text("\n".join(lines) + "\n")


RECORD_DAMAGE = {  # damage → the file and words the refusal names
    "a request line cut short": (cut_a_middle_line, "requests.jsonl: line 3"),
    "the last request line cut short": (lambda run: (run / "requests.jsonl").write_text(
        (run / "requests.jsonl").read_text()[:-30]), "requests.jsonl: last line cut short"),
    "summary.json not JSON": (lambda run: (run / "summary.json").write_text("{not json"), "summary.json: not JSON"),
    "summary.json a list": (lambda run: (run / "summary.json").write_text("[]"), "summary.json: JSON, but not"),
    "summary.json binary": (lambda run: (run / "summary.json").write_bytes(b"\xff\xfe"), "summary.json: not JSON"),
    "summary.json nested too deep": (lambda run: (run / "summary.json").write_text("[" * 100_000 + "]" * 100_000),
                                     "summary.json: not JSON"),
    "config.json not JSON": (lambda run: (run / "config.json").write_text('{"run_id": 5'), "config.json"),
    "a samples line not JSON": (lambda run: (run / "samples.jsonl").write_text(
        (run / "samples.jsonl").read_text() + "{garbage\n"), "samples.jsonl: line 2"),
    "a sample stamped 1e308 s into the run": (lambda run: stamp_first_sample(run, 1e308), "samples.jsonl: line 1"),
    "a sample stamped before the run": (lambda run: stamp_first_sample(run, -1), "samples.jsonl: line 1"),
    "samples.jsonl binary": (lambda run: (run / "samples.jsonl").write_bytes(b"\xff\xfe\n"), "samples.jsonl: line 1"),
    "requests.parquet garbage": (lambda run: (run / "requests.parquet").write_bytes(b"PAR1 not a table"),
                                 "requests.parquet: not a readable Parquet table"),
    "a run id that climbs out": (lambda run: set_run_id(run, "../../escaped"), "config.json: run id '../../escaped'"),
    "a run id with a slash": (lambda run: set_run_id(run, "a/b"), "config.json: run id 'a/b'"),
}


@pytest.fixture
def two_runs(work: dict[str, str]) -> Path:
    """Two valid records of a max_num_seqs sweep, from which `harness report` writes a report."""
    runs = Path(work["tmp"]) / "runs"
    for max_num_seqs in (1, 2):
        write_run(runs, limits={**BASE_LIMITS, "max_num_seqs": max_num_seqs})
    return runs


def test_the_records_damaged_below_give_a_report_when_whole(work: dict[str, str], two_runs: Path) -> None:
    done = CliRunner().invoke(app, [word.format(**work) for word in BASES["report"]])
    assert done.exit_code == 0, done.output
    assert (Path(work["tmp"]) / "report" / "report.html").is_file()


@pytest.mark.parametrize("damage", list(RECORD_DAMAGE))
def test_a_damaged_record_is_one_line_naming_its_file_and_no_report_is_written(
        work: dict[str, str], two_runs: Path, damage: str) -> None:
    run_dir = sorted(two_runs.iterdir())[0]
    harm, named = RECORD_DAMAGE[damage]
    harm(run_dir)
    args = [word.format(**work) for word in BASES["report"]]
    line = assert_refused(args, Path(work["tmp"]), named)
    assert str(run_dir) in line
    assert not (Path(work["tmp"]) / "escaped").exists()


def held_run(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"run_id": "0123abcd"}')
    return folder


REFUSED_AFTER_THE_CHECKS = {  # a run that could not start: its --out, and the server it was sent to
    "a new folder under missing parents": ("{tmp}/new/parent/run", [], lambda tmp: None),
    "an empty folder already there": ("{tmp}/empty", [], lambda tmp: (tmp / "empty").mkdir()),
    "--force over a run": ("{tmp}/held", ["--force"], lambda tmp: held_run(tmp / "held")),
}


@pytest.mark.parametrize("health_status", [None, 404, 200], ids=["no server", "health 404", "not vLLM"])
@pytest.mark.parametrize("out", list(REFUSED_AFTER_THE_CHECKS))
def test_a_run_that_could_not_start_leaves_the_disk_as_it_was(work: dict[str, str], out: str,
                                                              health_status: int | None) -> None:
    tmp = Path(work["tmp"])
    folder, extra, setup = REFUSED_AFTER_THE_CHECKS[out]
    setup(tmp)
    before = tree(tmp)
    with contextlib.ExitStack() as stack:
        url = UNREACHABLE if health_status is None else stack.enter_context(not_vllm(health_status))
        result = CliRunner().invoke(app, run_args(folder.format(**work), *extra, "--ready-timeout-s", "1",
                                                  base_url=url))
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(f"error: server {url}")
    assert tree(tmp) == before


def test_a_build_never_overwrites_an_inventory(work: dict[str, str]) -> None:
    inventory = Path(work["tmp"]) / "inventory"
    shutil.copytree(INVENTORY, inventory)
    for base in ("prompts build token-ids", "prompts build text"):
        args = [word.format(**work) for word in BASES[base]]
        assert_refused(args, Path(work["tmp"]), f"OUT {inventory}", "already holds an inventory")


def test_a_sweep_never_mixes_its_points_with_an_interrupted_one(work: dict[str, str]) -> None:
    (Path(work["tmp"]) / "sweep" / "point-0" / "service").mkdir(parents=True)
    args = [word.format(**work) for word in BASES["sweep"]]
    assert_refused(args, Path(work["tmp"]), f"--out {work['tmp']}/sweep", "point-0")


def test_an_engine_command_that_names_no_port_is_refused(work: dict[str, str]) -> None:
    for port in ("abc", "0", "65536", "\uff18\uff10"):
        args = [*BASES["run"][:5], "--concurrency", "1", "--", "python", "-m", "vllm.entrypoints.openai.api_server",
                "--port", port]
        assert_refused([word.format(**work) for word in args], Path(work["tmp"]), f"--port {port!r}")


EXPERIMENT = [str(ROOT / "polyaxonfiles" / "experiment.yaml"),
              str(ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml")]
PARAM_USERS = {  # a command that compiles polyaxonfiles, and a whole-number input of theirs
    "run-local": (["run-local", "-f", EXPERIMENT[0], "-f", EXPERIMENT[1], "--out", "{tmp}/points", "--offline-root",
                   "{tmp}/offline"], "concurrency"),
    "sweep": (["sweep", "-f", SWEEP, "--local", "--out", "{tmp}/sweep"], "concurrency"),
    "serve": (BASES["serve"], "max_num_seqs"),
}
WHOLE_NUMBERS_THAT_ARE_NOT = ["1e3", "true", "8\n", "8.5", "0", "-1", "", "\uff18"]


@pytest.mark.parametrize("value", WHOLE_NUMBERS_THAT_ARE_NOT)
@pytest.mark.parametrize("command", list(PARAM_USERS))
def test_a_param_that_is_not_a_whole_number_of_its_range_is_refused(work: dict[str, str], command: str,
                                                                    value: str) -> None:
    words, name = PARAM_USERS[command]
    args = [word.format(**work) for word in words] + ["-P", f"{name}={value}"]
    assert_refused(args, Path(work["tmp"]), name)


@pytest.mark.parametrize("namespace", ["a b", "", "-ns-", "ns\n"])
def test_a_namespace_that_cannot_be_part_of_the_services_url_is_refused(work: dict[str, str], monkeypatch,
                                                                       namespace: str) -> None:
    monkeypatch.setenv("POLYAXON_K8S_NAMESPACE", namespace)
    args = [word.format(**work) for word in BASES["run --service-uuid"] if word not in ("--base-url", UNREACHABLE)]
    assert_refused(args, Path(work["tmp"]), "POLYAXON_K8S_NAMESPACE")


@pytest.mark.parametrize(("spec", "named"), [
    ("kind: component\nrun:\n  kind: service\n  container:\n    image: local\n    command: [harness, run]\n",
     "run.kind is 'service'"),
    ("kind: component\nrun:\n  kind: job\n  container:\n    image: local\n    command: [python3, -V]\n",
     "expected the container command to start with 'harness'"),
], ids=["a-service", "not-the-harness"])
def test_run_local_refuses_a_file_it_cannot_run_before_making_any_point_folder(
    tmp_path: Path, spec: str, named: str
) -> None:
    (tmp_path / "spec.yaml").write_text(spec)
    assert_refused(["run-local", "-f", str(tmp_path / "spec.yaml"), "--out", str(tmp_path / "points")], tmp_path,
                   named)
    assert not (tmp_path / "points").exists()
