"""The live-token population predicted for a run's load, computed when the run ends: the run then has the
inventory, the load and the engine's cache geometry, so the record holds the prediction and the analysis
reads it there, as it reads every other figure.

The blocks are those `vllm:cache_config_info` reports: the `num_gpu_blocks` the engine logs at start-up. The
draws are `harness budget --inventory`'s (same function, same default seed), so the figure equals what that
command prints for the same inventory, concurrency, blocks and `max_num_seqs`, unless the run's `max_tokens`
replaced the inventory's output caps.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.inventory.frozen import Inventory
from harness.inventory.output_cap import request_tokens
from harness.measure.figures import PopulationFigures
from harness.measure.record import RunConfig, ServerSample
from harness.measure.reuse_figures import cache_geometry
from harness.predict.population import live_population


def population_figures(inventory: Inventory, config: RunConfig, samples: Sequence[ServerSample],
                       peak_usage_fraction: float | None, max_num_seqs: int | None) -> PopulationFigures | None:
    """None when the load sets no number in flight (an open loop without a cap) or no scrape gave the cache's
    geometry."""
    concurrency = config.load.in_flight_limit
    configs = [s.snapshot.cache_config for s in samples if s.snapshot is not None and s.snapshot.cache_config]
    block_size, usable_blocks = cache_geometry(configs[-1] if configs else {})
    if concurrency is None or block_size is None or usable_blocks is None:
        return None
    draws = live_population(request_tokens(inventory, config.max_tokens), concurrency, block_size=block_size,
                            usable_blocks=usable_blocks, max_num_seqs=max_num_seqs,
                            conversation_ids=[prompt.conversation_id for prompt in inventory.prompts])
    peak = None if peak_usage_fraction is None else round(peak_usage_fraction * usable_blocks) * block_size
    return PopulationFigures(
        concurrency=concurrency, max_num_seqs=max_num_seqs, live_requests=draws.live_requests,
        block_size_tokens=block_size, usable_blocks=usable_blocks,
        padded_tokens_p50_predicted=draws.p50_live_tokens, padded_tokens_p99_predicted=draws.p99_live_tokens,
        padded_tokens_max_predicted=draws.max_live_tokens, fit_share_predicted=draws.fit_share, draws=draws.draws,
        seed=draws.seed, peak_tokens_measured=peak,
    )
