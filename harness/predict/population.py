"""How many of a workload's requests the KV cache holds at once, and where a limit starts to bind.

A request holds whole blocks for its prompt and what it has generated, so at its largest it holds
ceil((prompt + output cap) / block_size) blocks. With C requests in flight the cache must hold the sum
over C requests drawn from the workload: a random sum whose tail, not its mean, decides whether vLLM
preempts. Requests beyond `max_num_seqs` wait in the queue without holding blocks, so the live
population is never larger than `max_num_seqs` requests.

The figures here are in blocks and tokens of one KV cache group (full attention): what the engine logs
as `num_gpu_blocks` less its reserved null block is what the population is held against.

A conversation's turns are not independent requests: the client sends them one after another, so it keeps
`concurrency` conversations in flight, each at one turn, and a turn's prompt holds its whole history (the
inventory counts it in the turn's prompt tokens). A draw is then C distinct conversations, each at one of its
turns, every turn of the inventory as likely as any other: a slot spends one turn's time on each turn, so a
conversation of more turns is in flight proportionally longer. That is the steady state of the client's
closed loop when turns take alike; a long prefill of a late turn, or think time, keeps a slot longer than
this counts, and the run measures what the draw leaves out.
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
    conversations: int | None = None  # the workload's conversations, when its requests are their turns
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
                    max_num_seqs: int | None = None, draws: int = DEFAULT_DRAWS, seed: int = 0,
                    conversation_ids: Sequence[str | None] | None = None) -> PopulationDraws:
    """The live population's quantiles over seeded draws of `concurrency` requests from the workload.

    The client cycles through the inventory, so the requests in flight are distinct until there are more
    of them than prompts: draws are without replacement from the inventory repeated as often as needed.
    With `conversation_ids` (each request's, None for one outside any conversation), the requests in flight
    are turns of distinct conversations, drawn as the module says.
    """
    if concurrency < 1:
        raise HarnessError(f"concurrency must be at least 1, got {concurrency}")
    blocks = request_blocks(request_tokens, block_size)
    live = min(concurrency, max_num_seqs) if max_num_seqs else concurrency
    rng = np.random.default_rng(seed)
    turns = _conversation_turns(blocks, conversation_ids)
    if turns is None:
        pool = np.tile(blocks, math.ceil(live / len(blocks)))
        sums = _draw_sums(pool, live, draws, rng)
        largest = pool
    else:
        pooled = turns * math.ceil(live / len(turns))  # passes over the inventory overlap when C outnumbers them
        sums = _conversation_sums(pooled, live, draws, rng)
        largest = np.array([conversation.max() for conversation in pooled])
    return PopulationDraws(
        concurrency=concurrency, live_requests=live, conversations=None if turns is None else len(turns),
        block_size=block_size, usable_blocks=usable_blocks, draws=draws, seed=seed,
        p50_blocks=int(np.quantile(sums, 0.5, method="higher")),
        p99_blocks=int(np.quantile(sums, 0.99, method="higher")),
        max_blocks=int(np.sort(largest)[-live:].sum()),
        fit_share=float(np.mean(sums <= usable_blocks)),
    )


def _conversation_turns(blocks: np.ndarray, conversation_ids: Sequence[str | None] | None) -> list[np.ndarray] | None:
    """Each conversation's turns' blocks in inventory order (a request outside any is one of its own); None
    when no conversation has more than one turn, so the requests are drawn as independent ones."""
    if conversation_ids is None:
        return None
    if len(conversation_ids) != len(blocks):
        raise HarnessError(f"{len(conversation_ids)} conversation ids for {len(blocks)} requests")
    grouped: dict[object, list[int]] = {}
    for index, conversation in enumerate(conversation_ids):
        grouped.setdefault(index if conversation is None else conversation, []).append(int(blocks[index]))
    if all(len(turns) == 1 for turns in grouped.values()):
        return None
    return [np.array(turns, dtype=np.int64) for turns in grouped.values()]


def _conversation_sums(conversations: list[np.ndarray], live: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Sums of `live` turns of distinct conversations, every turn equally likely: conversations drawn without
    replacement in proportion to their turns (the Gumbel top-k draw), then a turn of each uniformly. From a pool
    many times larger than a draw, turns are drawn uniformly with replacement instead (two of one conversation
    then come together too rarely to move a quantile), which needs no pool-sized array per draw."""
    counts = np.array([len(turns) for turns in conversations])
    flat = np.concatenate(conversations)
    if len(conversations) > WITH_REPLACEMENT_RATIO * live:
        return flat[rng.integers(0, len(flat), size=(draws, live))].sum(axis=1)
    keys = np.log(counts)[None, :] + rng.gumbel(size=(draws, len(conversations)))
    chosen = np.argpartition(-keys, live - 1, axis=1)[:, :live]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    turn = (rng.random((draws, live)) * counts[chosen]).astype(np.int64)
    return flat[starts[chosen] + turn].sum(axis=1)


def _draw_sums(pool: np.ndarray, live: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Sums of `live` requests drawn without replacement; from a pool many times larger than a draw, with
    replacement, which differs from it by less than the draws' own noise and needs no pool-sized array per draw."""
    if len(pool) > WITH_REPLACEMENT_RATIO * live:
        return pool[rng.integers(0, len(pool), size=(draws, live))].sum(axis=1)
    chosen = np.argpartition(rng.random((draws, len(pool))), live - 1, axis=1)[:, :live]
    return pool[chosen].sum(axis=1)


def predict_knee(prompt_tokens: Sequence[int], output_tokens: Sequence[int], *, block_size: int,
                 usable_blocks: int, max_num_seqs: int | None, largest_concurrency: int, seed: int = 0,
                 conversation_ids: Sequence[str | None] | None = None) -> KneePrediction:
    """The first concurrency at which the cache or the sequence cap makes requests wait, up to
    `largest_concurrency`; and, before it, where the cache starts to preempt.

    The cache makes arrivals wait where the median arrival finds too few free blocks for its prompt
    (`harness.predict.queueing`, which takes a conversation's turns as requests of their own); the sequence
    cap one request past it, where the next request waits in the queue. Preemption starts earlier, where
    the median draw of requests at their largest overflows. `conversation_ids` as for `live_population`.
    """
    request_tokens = [prompt + output for prompt, output in zip(prompt_tokens, output_tokens, strict=True)]
    preemption_knee = None
    always_fits = 0
    for concurrency in range(1, largest_concurrency + 1):
        draws = live_population(request_tokens, concurrency, block_size=block_size, usable_blocks=usable_blocks,
                                max_num_seqs=max_num_seqs, seed=seed, conversation_ids=conversation_ids)
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
