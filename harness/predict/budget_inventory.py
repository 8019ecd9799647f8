"""`harness budget --inventory`: the live population of C requests drawn from an inventory, held against the
KV blocks the engine has — as it logged them, or as the calculator predicts them from the model and the memory.

The inventory itself is read by the command line (a later stage); here it is only the requests' lengths.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict
from rich.table import Table

from harness.errors import HarnessError
from harness.predict.budget_plan import BudgetOptions, plan_capacity
from harness.predict.model_shape import ModelShape
from harness.predict.population import PopulationDraws, live_population

SCHEMA_VERSION = 1
NULL_BLOCKS = 1  # vLLM keeps block 0 of the pool as its null block: never a request's


class KvBlocks(BaseModel):
    """The blocks a population is held against, and where the figure came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_size: int
    usable_blocks: int
    source: str


class InventoryPopulation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    inventory: str
    inventory_sha256: str
    prompt_count: int
    kv: KvBlocks
    population: PopulationDraws


def kv_blocks(options: BudgetOptions, shape: ModelShape | None, warnings: list[str]) -> KvBlocks:
    """Usable blocks from --num-gpu-blocks or --kv-cache-tokens as vLLM logged them, else from the calculator's
    capacity prediction for the model and the KV memory option given."""
    size = options.block_size
    if options.num_gpu_blocks is not None and options.kv_cache_tokens is not None:
        raise HarnessError("give only one of --num-gpu-blocks and --kv-cache-tokens")
    if options.num_gpu_blocks is not None:
        return KvBlocks(block_size=size, usable_blocks=options.num_gpu_blocks - NULL_BLOCKS,
                        source=f"--num-gpu-blocks {options.num_gpu_blocks}, less the null block")
    if options.kv_cache_tokens is not None:
        blocks = options.kv_cache_tokens // size
        if blocks <= NULL_BLOCKS:
            raise HarnessError(f"--kv-cache-tokens {options.kv_cache_tokens}: {blocks} block(s) of {size} tokens "
                               "leave none for requests")
        return KvBlocks(block_size=size, usable_blocks=blocks - NULL_BLOCKS,
                        source=f"--kv-cache-tokens {options.kv_cache_tokens:,} = {blocks:,} blocks of {size}, "
                               "less the null block")
    if shape is None:
        raise HarnessError("no model to compute the KV blocks of")
    weights = None if shape.weights_bytes is None else -(-shape.weights_bytes // options.tensor_parallel_size)
    capacity = plan_capacity(shape, options, weights, warnings)
    if capacity is None:
        raise HarnessError("--inventory needs the engine's KV blocks: --num-gpu-blocks or --kv-cache-tokens as "
                           "vLLM logged them, or --available-kv-gib, --kv-cache-memory-bytes or --gpu-memory-gib")
    if capacity.kv_cache_groups != 1:
        raise HarnessError(f"{shape.name}: {capacity.kv_cache_groups} KV cache groups; the live population is "
                           "modelled for one group of full-attention layers")
    return KvBlocks(block_size=capacity.block_size, usable_blocks=capacity.num_blocks - NULL_BLOCKS,
                    source=f"{shape.name}: {capacity.num_blocks:,} blocks predicted from "
                           f"{capacity.available_kv_source}, less the null block")


def price_inventory(name: str, digest: str, request_tokens: Sequence[int], options: BudgetOptions,
                    kv: KvBlocks, conversation_ids: Sequence[str | None]) -> InventoryPopulation:
    """The population of `--concurrency` requests (prompt + output cap each) drawn from the inventory; for a
    conversation inventory, `--concurrency` conversations each at one turn, its prompt the whole history."""
    if options.concurrency is None:
        raise HarnessError("--inventory needs --concurrency: the requests in flight")
    draws = live_population(request_tokens, options.concurrency, block_size=kv.block_size,
                            usable_blocks=kv.usable_blocks, max_num_seqs=options.max_num_seqs,
                            conversation_ids=conversation_ids)
    return InventoryPopulation(inventory=name, inventory_sha256=digest, prompt_count=len(request_tokens), kv=kv,
                               population=draws)


def population_table(priced: InventoryPopulation) -> Table:
    draws = priced.population
    if draws.conversations is None:
        drawn = f"{draws.concurrency} requests from {priced.inventory} ({priced.prompt_count} prompts"
    else:
        drawn = (f"{draws.concurrency} conversations from {priced.inventory} ({draws.conversations} conversations "
                 f"of {priced.prompt_count} turns, each at a turn drawn uniformly over the turns, history included")
    table = Table(title=f"Live population of {drawn}, prompt + output cap each)", show_header=False)
    table.add_row("inventory_sha256", priced.inventory_sha256)
    table.add_row("requests live at once", f"{draws.live_requests}" + (
        f" (max_num_seqs; {draws.concurrency - draws.live_requests} wait in the queue)"
        if draws.live_requests < draws.concurrency else ""))
    table.add_row("KV blocks for requests", f"{kv_line(priced.kv)}")
    for label, blocks, tokens in (("p50", draws.p50_blocks, draws.p50_live_tokens),
                                  ("p99", draws.p99_blocks, draws.p99_live_tokens),
                                  ("max", draws.max_blocks, draws.max_live_tokens)):
        table.add_row(f"{label} block-padded live tokens", f"{tokens:,} ({blocks:,} blocks)")
    table.add_row("share of draws that fit", f"{draws.fit_share:.3f} of {draws.draws:,} draws (seed {draws.seed})",
                  style="bold")
    return table


def kv_line(kv: KvBlocks) -> str:
    return f"{kv.usable_blocks:,} of {kv.block_size} tokens = {kv.usable_blocks * kv.block_size:,} tokens — {kv.source}"
