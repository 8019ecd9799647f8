"""Where arriving requests start to wait for KV blocks: the population a new request arrives into.

Preemption starts where the requests in flight, each at its largest, no longer fit (`population`). A
latency objective on TTFT breaks later, where a request that arrives finds too few free blocks for its
prompt and waits in the queue. vLLM admits a waiting request when its prompt's blocks are free; the
blocks the others hold then are those of requests part-way through their outputs, not at their largest.

In a closed loop every slot is refilled as soon as its request ends, so at the instant a request arrives
the other C − 1 slots each hold a request seen at a random moment of its life: a request is in flight in
proportion to how long it runs (its output tokens, one decode step each), and it has generated a
uniformly drawn part of its output, holding ceil((prompt + generated + 1) / block_size) blocks (the
slot for the token it computes next included). The arrival needs ceil(prompt / block_size) blocks of
its own. The queue knee is the first concurrency whose median arrival does not fit.

On the demo's engine (31 usable blocks of 128; prompts of 600 tokens, outputs of 300) a request in
flight holds 5, 6, 7 or 8 blocks (6.32 on average), so 4 others and an arrival need about 30 blocks and
5 others about 37: preemption from 4 in flight, the queue from 6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from harness.errors import HarnessError

QUEUE_DRAWS = 4096


def arrival_blocks(prompt_tokens: Sequence[int], output_tokens: Sequence[int], concurrency: int, *,
                   block_size: int, draws: int = QUEUE_DRAWS, seed: int = 0) -> np.ndarray:
    """Per draw, the blocks held when a request arrives with `concurrency - 1` others in flight, its own
    prompt's blocks included."""
    prompts, outputs = np.asarray(prompt_tokens, dtype=np.int64), np.asarray(output_tokens, dtype=np.int64)
    if len(prompts) != len(outputs) or not len(prompts) or min(outputs) < 1 or min(prompts) < 1:
        raise HarnessError("a workload needs requests of a positive prompt and output length")
    if concurrency < 1 or block_size < 1:
        raise HarnessError(f"concurrency and block_size must be positive, got {concurrency} and {block_size}")
    rng = np.random.default_rng(seed)
    others = concurrency - 1
    in_flight = rng.choice(len(prompts), size=(draws, others), p=outputs / outputs.sum())  # by how long each runs
    generated = np.floor(rng.random((draws, others)) * outputs[in_flight]).astype(np.int64)
    held = np.ceil((prompts[in_flight] + generated + 1) / block_size).astype(np.int64).sum(axis=1)
    arriving = rng.integers(0, len(prompts), size=draws)  # the client cycles through the inventory
    return held + np.ceil(prompts[arriving] / block_size).astype(np.int64)


def queue_knee(prompt_tokens: Sequence[int], output_tokens: Sequence[int], *, block_size: int, usable_blocks: int,
               largest_concurrency: int, seed: int = 0) -> int | None:
    """The first concurrency up to `largest_concurrency` whose median arrival finds too few free blocks."""
    for concurrency in range(1, largest_concurrency + 1):
        needed = arrival_blocks(prompt_tokens, output_tokens, concurrency, block_size=block_size, seed=seed)
        if math.ceil(float(np.quantile(needed, 0.5, method="higher"))) > usable_blocks:
            return concurrency
    return None
