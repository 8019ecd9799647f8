"""What the real CPU engine's figures are worth: queues no scrape saw, bursts, and a client that stalled.

One engine serves every test here: max_num_seqs 1, so 8 requests in flight always queue, and
`--stream-interval 8`, vLLM's own option to send a request's tokens to the client 8 steps at a time, so
the stream arrives in bursts by the engine's design, not by chance.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from analysis.diagnose import SCHEDULING, diagnose
from harness.dev.tiny_model import SPECIAL_TOKENS, VOCAB_SIZE
from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange, write_inventory
from harness.launch.engine_process import RunningEngine
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape
from harness.measure.stats import RunSummary
from harness.track.tracking import run_outputs

from conftest import HARNESS, local_cpu_engine

pytestmark = pytest.mark.engine

STREAM_INTERVAL = 8
OUTPUT_TOKENS = 64
FidelityEngine = tuple[RunningEngine, Path, Path]  # the engine, its inventory, the module's work directory


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FidelityEngine]:
    work = tmp_path_factory.mktemp("fidelity")
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=0, high=VOCAB_SIZE - len(SPECIAL_TOKENS)),
                           prompt_tokens=[128] * 16, output_cap_tokens=[OUTPUT_TOKENS] * 16, seed=5)
    inventory = write_inventory(build_token_id_inventory("tiny-16x192", recipe), work / "inventory")
    with local_cpu_engine(tiny_model_dir, work / "engine.log", max_num_seqs=1, kv_cache_memory_bytes=16 * 2**20,
                          extra_args=f"--stream-interval {STREAM_INTERVAL}") as running:
        yield running, inventory, work


def measure(engine: FidelityEngine, *, sample_interval_s: float, out: Path) -> RunSummary:
    running, inventory, _ = engine
    config, prompts = build_run_config(RunOptions(
        inventory=inventory, base_url=running.base_url, load=LoadShape(concurrency=8), cold=True,
        sample_interval_s=sample_interval_s,
    ))
    return run_load(config, prompts, out, ready_timeout_s=60)


def test_a_queue_no_scrape_caught_is_read_from_the_engine_and_named_the_sequence_cap(engine, tmp_path: Path) -> None:
    # one scrape before the load and one after it: both see an empty queue
    summary = measure(engine, sample_interval_s=60.0, out=tmp_path / "run")
    assert summary.peak_waiting_requests == 0
    # 8 in flight over 1 seat: on average about 7 wait (Little's law on vLLM's queue-time histogram)
    waiting, running = summary.engine_waiting_requests_mean, summary.engine_running_requests_mean
    assert waiting is not None and running is not None, "the engine exported no queue or running histogram"
    assert waiting > 3
    assert 0.5 < running <= 1.02  # one at a time, never more
    row = pd.Series({**run_outputs(summary), "max_num_seqs": 1, "concurrency": 8}, name="capped")
    verdict = diagnose("capped", row, None)
    assert verdict.bound_by == SCHEDULING, verdict.text
    assert "peak_waiting_requests=0" in verdict.evidence  # the sample alone would have said no queue


def test_a_stream_sent_in_bursts_is_flagged_and_its_per_token_figures_withheld(engine, tmp_path: Path) -> None:
    summary = measure(engine, sample_interval_s=0.5, out=tmp_path / "run")
    # tokens come 8 at a time: at most one arrival instant in 8 carries a first token
    assert summary.largest_burst_tokens is not None and summary.burst_token_fraction is not None
    assert summary.largest_burst_tokens >= STREAM_INTERVAL
    assert summary.burst_token_fraction > 0.5 and summary.per_token_latency_paced is False
    assert summary.qualifications and "not per-token figures" in summary.qualifications[0]
    outputs = run_outputs(summary)
    assert "tpot_ms_p50" not in outputs and "itl_ms_p99" not in outputs and "ttft_ms_p99" in outputs
    # the engine's own inter-token time is a per-token figure whatever the stream did
    assert summary.engine_itl_ms_mean is not None and summary.engine_itl_ms_mean > 0


def test_a_client_stopped_mid_run_is_an_invalid_measurement(engine, tmp_path: Path) -> None:
    running, inventory, _ = engine
    out = tmp_path / "run"
    process = subprocess.Popen([HARNESS, "run", "--inventory", str(inventory), "--base-url", running.base_url,
                                "--concurrency", "8", "--sample-interval-s", "0.5", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (out / "requests.jsonl").exists() or not (out / "requests.jsonl").read_text():
        assert time.monotonic() < deadline and process.poll() is None, "no request finished"
        time.sleep(0.05)
    process.send_signal(signal.SIGSTOP)  # the whole client: its event loop, its sampler
    time.sleep(3.0)
    process.send_signal(signal.SIGCONT)
    _, stderr = process.communicate(timeout=120)
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["valid"], stderr
    assert summary["loop_lag_ms_max"] >= 2500  # the probe's one late tick spans the stop
    assert any(reason.startswith("client event loop stalled") for reason in summary["invalid_reasons"])
