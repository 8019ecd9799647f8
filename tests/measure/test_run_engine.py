"""`harness run` against the real CPU engine: waiting, preemption and usage as the engine reports them.

One engine start serves every test here: max_num_seqs 4 and 4 MiB of KV cache (4,096 tokens of the tiny
model in 32 blocks of 128, one of them the reserved null block). Eight requests of 600 prompt + 400
output tokens at concurrency 8: at most 4 run, so at least 4 wait; 4 running sequences of 1,000 tokens
need 4 x 8 = 32 blocks but only 31 are usable, so the engine must preempt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.dev.tiny_model import SPECIAL_TOKENS, VOCAB_SIZE
from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import (
    TokenIdRecipe,
    VocabularyRange,
    load_inventory,
    write_inventory,
)
from harness.measure.figures import PARTS, read_run_figures
from harness.measure.record import read_requests, read_samples
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape
from harness.measure.stats import RunSummary

from conftest import invalid_but_for_a_busy_machine, local_cpu_engine

pytestmark = pytest.mark.engine

MAX_NUM_SEQS = 4
PROMPT_TOKENS = 600
OUTPUT_TOKENS = 400


@pytest.fixture(scope="module")
def engine_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSummary, Path, Path]:
    work = tmp_path_factory.mktemp("run-engine")
    recipe = TokenIdRecipe(
        vocabulary=VocabularyRange(low=0, high=VOCAB_SIZE - len(SPECIAL_TOKENS)),
        prompt_tokens=[PROMPT_TOKENS] * 8,
        output_cap_tokens=[OUTPUT_TOKENS] * 8,
        seed=3,
    )
    inventory_dir = write_inventory(build_token_id_inventory("tiny-8x1000", recipe), work / "inventory")
    with local_cpu_engine(
        tiny_model_dir, work / "engine.log", max_num_seqs=MAX_NUM_SEQS, kv_cache_memory_bytes=4_194_304,
        max_model_len=1024,
    ) as engine:
        config, inventory = build_run_config(RunOptions(
            inventory=inventory_dir, base_url=engine.base_url, load=LoadShape(concurrency=8), cold=True,
            sample_interval_s=0.1,
        ))
        summary = run_load(config, inventory, work / "run", ready_timeout_s=60)
    return summary, work / "run", inventory_dir


def test_concurrency_above_max_num_seqs_shows_waiting_in_the_samples(engine_run) -> None:
    summary, run_dir, _ = engine_run
    snapshots = [s.snapshot for s in read_samples(run_dir) if s.snapshot is not None]
    assert len(snapshots) >= 5
    running = [s.num_requests_running for s in snapshots if s.num_requests_running is not None]
    assert len(running) == len(snapshots) and max(running) <= MAX_NUM_SEQS
    # 8 in flight over 4 slots: requests wait; a 0.1 s sampler may catch the queue a little drained already
    assert summary.server.peak_waiting_requests is not None and summary.server.peak_waiting_requests >= 1
    queue = snapshots[-1].request_queue_time_seconds  # every request's queue time, nothing sampled away
    assert queue is not None and queue.count >= 8 and queue.sum > 0
    assert summary.errors_by_class == {} and summary.requests_ok == 8


def test_kv_capacity_below_the_live_tokens_shows_preemptions(engine_run) -> None:
    summary, _, _ = engine_run
    assert summary.server.preemptions_during_run is not None and summary.server.preemptions_during_run >= 1
    # Whenever 4 sequences run they hold at least 4 x ceil(600 / 128) = 20 of the 31 usable blocks; the
    # sampler may miss the fullest moment, so only that floor is certain.
    usage = summary.server.peak_kv_cache_usage_fraction
    assert usage is not None and usage >= 20 / 31


def test_usage_counts_match_the_inventory(engine_run) -> None:
    summary, run_dir, inventory_dir = engine_run
    expected = {p.prompt_id: (p.prompt_tokens, p.output_cap_tokens) for p in load_inventory(inventory_dir).prompts}
    records = read_requests(run_dir)
    assert sorted(r.prompt_id for r in records) == sorted(expected)
    for record in records:
        assert (record.prompt_tokens, record.output_tokens) == expected[record.prompt_id]
        assert sum(record.chunk_tokens) == OUTPUT_TOKENS
        assert record.finish_reason == "length"
    assert summary.prompt_token_mismatches == 0
    # Random token ids share no prefix, so the run declared cold stays valid.
    assert summary.server.prefix_cache_hits_during_run_tokens == 0
    assert invalid_but_for_a_busy_machine(summary.invalid_reasons) == []


def test_every_figure_of_the_summary_parts_is_filled_by_the_real_engine(engine_run) -> None:
    """The parts the emulator leaves empty (the engine's histograms) and every other part: each of their figures
    has a value in a real engine's run, so none is a name that nothing fills."""
    summary, run_dir, _ = engine_run
    figures = read_run_figures(run_dir)
    assert figures.summary == summary and figures.config.run_id == summary.run_id
    parts = {part: getattr(summary, part).model_dump() for part in PARTS}
    assert set(parts["engine"]) >= {"engine_queue_ms_mean", "frontend_share"}  # the scan reads the parts' figures
    unfilled = {part: sorted(name for name, value in found.items() if value is None) for part, found in parts.items()}
    assert {part: names for part, names in unfilled.items() if names} == {}
