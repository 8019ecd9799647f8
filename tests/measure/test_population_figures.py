"""The live-token population a run predicts for its load when it ends, beside the peak it measured: a worked
example, and its figures as declared dashboard outputs."""

from __future__ import annotations

import pytest

from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange
from harness.measure.figures import PopulationFigures, output_names
from harness.measure.population_figures import population_figures
from harness.measure.record import RunConfig, ServerSample, Slo
from harness.measure.schedule import LoadShape
from harness.measure.stats import summarize
from harness.observe.server_metrics import MetricsSnapshot

# 4 prompts of 1,000-4,000 tokens, each sent with 24 output tokens: 1,024, 2,024, 3,024 and 4,024 tokens,
# ceil(t / 128) = 8, 16, 24 and 32 blocks of 128.
INVENTORY = build_token_id_inventory("ladder", TokenIdRecipe(
    vocabulary=VocabularyRange(low=0, high=500), prompt_tokens=[1000, 2000, 3000, 4000], output_cap_tokens=[64] * 4,
    seed=0))
# 41 blocks, block 0 vLLM's null block: 40 usable. The busiest scrape saw 90% of them in use.
SAMPLES = [ServerSample(t_s=float(t), snapshot=MetricsSnapshot(
    kv_cache_usage_fraction=usage, cache_config={"block_size": "128", "num_gpu_blocks": "41"}))
    for t, usage in enumerate((0.2, 0.9, 0.5))]


def config(load: LoadShape) -> RunConfig:
    return RunConfig(run_id="r", base_url="http://127.0.0.1:8000", inventory_path="prompts/x",
                     inventory_digest=INVENTORY.digest, load=load, max_tokens=24, temperature=0.0, slo=Slo(),
                     cold=False, max_dispatch_lag_ms=10.0, sample_interval_s=1.0, read_timeout_s=60.0,
                     stall_timeout_s=30.0)


def test_the_population_of_the_run_s_load_beside_its_measured_peak() -> None:
    # 3 in flight, but max_num_seqs 2: 2 live, drawn without replacement from the 4. The 6 pairs hold
    # 8+16=24, 8+24=32, 8+32=40, 16+24=40, 16+32=48 and 24+32=56 blocks, each a sixth of the draws:
    # p50 40 blocks (a third of the pairs hold at most 32, two thirds at most 40) = 5,120 tokens; p99 and max
    # 56 blocks = 7,168 tokens; 4 of the 6 fit the 40 usable blocks, 2/3 (sampled: within 0.03 over 4,096
    # draws, whose standard error is 0.007). The run's max_tokens 24 replaces the inventory's caps of 64.
    figures = population_figures(INVENTORY, config(LoadShape(concurrency=3)), SAMPLES, 0.9, max_num_seqs=2)
    assert figures is not None
    assert (figures.concurrency, figures.max_num_seqs, figures.live_requests) == (3, 2, 2)
    assert (figures.block_size_tokens, figures.usable_blocks) == (128, 40)
    assert figures.padded_tokens_p50_predicted == 5120
    assert figures.padded_tokens_p99_predicted == figures.padded_tokens_max_predicted == 7168
    assert figures.fit_share_predicted == pytest.approx(2 / 3, abs=0.03)
    # the measured peak: 90% of 40 blocks = 36 blocks = 4,608 tokens
    assert figures.peak_tokens_measured == 4608


def test_an_open_loop_without_a_cap_or_a_server_without_its_geometry_predicts_none() -> None:
    assert population_figures(INVENTORY, config(LoadShape(rate_per_s=2.0)), SAMPLES, 0.9, None) is None
    bare = [ServerSample(t_s=0.0, snapshot=MetricsSnapshot(kv_cache_usage_fraction=0.5))]
    assert population_figures(INVENTORY, config(LoadShape(concurrency=2)), bare, 0.5, None) is None
    # a capped open loop: its in-flight cap is the number in flight
    capped = population_figures(INVENTORY, config(LoadShape(rate_per_s=2.0, max_concurrency=1)), SAMPLES, None, None)
    assert capped is not None and capped.live_requests == 1 and capped.peak_tokens_measured is None
    # one request at a time: its largest is 32 blocks = 4,096 tokens, and every draw fits the 40
    assert capped.padded_tokens_max_predicted == 4096 and capped.fit_share_predicted == 1.0


def test_the_population_reaches_the_dashboard_as_declared_outputs() -> None:
    figures = population_figures(INVENTORY, config(LoadShape(concurrency=3)), SAMPLES, 0.9, max_num_seqs=2)
    summary = summarize([], [], slo=Slo(), offered_requests_per_s=None, offered_concurrency=3, cold=False,
                        max_dispatch_lag_ms=10.0).model_copy(update={"population": figures})
    outputs = summary.outputs()
    prefixed = {name: value for name, value in outputs.items() if name.startswith("population_")}
    assert "population" not in outputs and len(prefixed) == len(PopulationFigures.model_fields)
    assert prefixed["population_padded_tokens_p50_predicted"] == 5120
    assert set(prefixed) <= output_names()
