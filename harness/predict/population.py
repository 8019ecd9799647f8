"""How many of a workload's requests the KV cache holds at once, and where a limit starts to bind.

A request holds whole blocks for its prompt and what it has generated, so at its largest it holds
ceil((prompt + output cap) / block_size) blocks. With C requests in flight the cache must hold the sum
over C requests drawn from the workload: a random sum whose tail, not its mean, decides whether vLLM
preempts. Requests beyond `max_num_seqs` wait in the queue without holding blocks, so the live
population is never larger than `max_num_seqs` requests.

The figures here are in blocks and tokens of one KV cache group (full attention): what the engine logs
as `num_gpu_blocks` less its reserved null block is what the population is held against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, computed_field

from harness.errors import HarnessError
from harness.predict.queueing import queue_knee

DEFAULT_DRAWS = 4096
WITH_REPLACEMENT_RATIO = 8  # a pool this many times a draw's size is sampled with replacement


class Bound(StrEnum):
    """The limit that first stops more requests from running together."""

    KV_CACHE = "kv_cache"
    MAX_NUM_SEQS = "max_num_seqs"
    NONE = "none"


class PopulationDraws(BaseModel):
    """The block-padded live population of `concurrency` requests drawn from a workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int
    live_requests: int  # concurrency, capped at max_num_seqs
    block_size: int
    usable_blocks: int
    draws: int
    seed: int
    p50_blocks: int
    p99_blocks: int
    max_blocks: int
    fit_share: float  # share of draws whose blocks fit the usable blocks

    @computed_field  # type: ignore[prop-decorator]
    @property
    def p50_live_tokens(self) -> int:
        """Block-padded: the tokens the blocks hold, not the tokens the requests count."""
        return self.p50_blocks * self.block_size

    @computed_field  # type: ignore[prop-decorator]
    @property
    def p99_live_tokens(self) -> int:
        return self.p99_blocks * self.block_size

    @computed_field  # type: ignore[prop-decorator]
    @property
    def max_live_tokens(self) -> int:
        return self.max_blocks * self.block_size


class KneePrediction(BaseModel):
    """The first load at which a limit binds, which limit it is, and where the cache starts to preempt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knee_concurrency: int | None  # None: no limit binds up to the largest concurrency asked about
    bound_by: Bound
    queue_knee_concurrency: int | None  # first concurrency whose median arrival waits for blocks (`queueing`)
    preemption_knee_concurrency: int | None  # first concurrency whose median population at its largest overflows
    always_fits_up_to_concurrency: int  # the largest concurrency whose largest population still fits
    max_num_seqs: int | None
    usable_blocks: int
    block_size: int


def request_blocks(request_tokens: Sequence[int], block_size: int) -> np.ndarray:
    """Each request's blocks at its largest: prompt + output cap, rounded up to whole blocks."""
    if block_size < 1:
        raise HarnessError(f"block_size must be a positive number of tokens, got {block_size}")
    if not request_tokens or min(request_tokens) < 1:
        raise HarnessError("a workload needs at least one request of a positive number of tokens")
    return np.array([math.ceil(tokens / block_size) for tokens in request_tokens], dtype=np.int64)


def live_population(request_tokens: Sequence[int], concurrency: int, *, block_size: int, usable_blocks: int,
                    max_num_seqs: int | None = None, draws: int = DEFAULT_DRAWS, seed: int = 0) -> PopulationDraws:
    """The live population's quantiles over seeded draws of `concurrency` requests from the workload.

    The client cycles through the inventory, so the requests in flight are distinct until there are more
    of them than prompts: draws are without replacement from the inventory repeated as often as needed.
    """
    if concurrency < 1:
        raise HarnessError(f"concurrency must be at least 1, got {concurrency}")
    blocks = request_blocks(request_tokens, block_size)
    live = min(concurrency, max_num_seqs) if max_num_seqs else concurrency
    pool = np.tile(blocks, math.ceil(live / len(blocks)))
    sums = _draw_sums(pool, live, draws, np.random.default_rng(seed))
    return PopulationDraws(
        concurrency=concurrency, live_requests=live, block_size=block_size, usable_blocks=usable_blocks,
        draws=draws, seed=seed,
        p50_blocks=int(np.quantile(sums, 0.5, method="higher")),
        p99_blocks=int(np.quantile(sums, 0.99, method="higher")),
        max_blocks=int(np.sort(pool)[-live:].sum()),
        fit_share=float(np.mean(sums <= usable_blocks)),
    )


def _draw_sums(pool: np.ndarray, live: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Sums of `live` requests drawn without replacement; from a pool many times larger than a draw, with
    replacement, which differs from it by less than the draws' own noise and needs no pool-sized array per draw."""
    if len(pool) > WITH_REPLACEMENT_RATIO * live:
        return pool[rng.integers(0, len(pool), size=(draws, live))].sum(axis=1)
    chosen = np.argpartition(rng.random((draws, len(pool))), live - 1, axis=1)[:, :live]
    return pool[chosen].sum(axis=1)


def predict_knee(prompt_tokens: Sequence[int], output_tokens: Sequence[int], *, block_size: int,
                 usable_blocks: int, max_num_seqs: int | None, largest_concurrency: int,
                 seed: int = 0) -> KneePrediction:
    """The first concurrency at which the cache or the sequence cap makes requests wait, up to
    `largest_concurrency`; and, before it, where the cache starts to preempt.

    The cache makes arrivals wait where the median arrival finds too few free blocks for its prompt
    (`harness.predict.queueing`); the sequence cap one request past it, where the next request waits in
    the queue. Preemption starts earlier, where the median draw of requests at their largest overflows.
    """
    request_tokens = [prompt + output for prompt, output in zip(prompt_tokens, output_tokens, strict=True)]
    preemption_knee = None
    always_fits = 0
    for concurrency in range(1, largest_concurrency + 1):
        draws = live_population(request_tokens, concurrency, block_size=block_size,
                                usable_blocks=usable_blocks, max_num_seqs=max_num_seqs, seed=seed)
        if draws.max_blocks <= usable_blocks:
            always_fits = concurrency
        if draws.p50_blocks > usable_blocks and draws.live_requests == concurrency:
            preemption_knee = concurrency
            break
    waits = queue_knee(prompt_tokens, output_tokens, block_size=block_size, usable_blocks=usable_blocks,
                       largest_concurrency=largest_concurrency, seed=seed)
    seqs_knee = max_num_seqs + 1 if max_num_seqs and max_num_seqs < largest_concurrency else None
    knees = {Bound.KV_CACHE: waits, Bound.MAX_NUM_SEQS: seqs_knee}
    bound, knee = min(((b, k) for b, k in knees.items() if k is not None), key=lambda item: item[1],
                      default=(Bound.NONE, None))
    return KneePrediction(knee_concurrency=knee, bound_by=bound, queue_knee_concurrency=waits,
                          preemption_knee_concurrency=preemption_knee, always_fits_up_to_concurrency=always_fits,
                          max_num_seqs=max_num_seqs, usable_blocks=usable_blocks, block_size=block_size)
