"""Which leading tokens the prompts of imported traffic share: a system prompt many requests start with, a
conversation's earlier turns resent with each request.

Found in tokens, as the server tokenizes the prompts (a chat request's template included), and at token
level, not in blocks: the block size is the engine's, so the prefix-cache prediction rounds down to whole
blocks when it knows it. A prompt records each length at which its tokens stop agreeing with some other
prompt's, so any two prompts agree exactly up to the longest length they both record under one name.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence

import numpy as np

from harness.inventory.fields import SharedPrefix

TokenIds = Sequence[int]


def token_ids_sha256(token_ids: TokenIds) -> str:
    """The name of a run of token ids: equal names, equal ids."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()


def find_shared_prefixes(prompts: Sequence[TokenIds]) -> list[list[SharedPrefix]]:
    """Per prompt, in the order given, the leading runs it shares with another prompt, shortest first.

    In lexicographic order the tokens prompt k shares with prompt j are the fewest any neighbours between
    them share, so the lengths prompt k shares are the falling minima of its neighbours' common lengths on
    either side: found by following the next smaller common length, not by comparing every pair.
    """
    order = sorted(range(len(prompts)), key=lambda index: list(prompts[index]))
    common = [_common_length(prompts[a], prompts[b]) for a, b in itertools.pairwise(order)]
    right, left = _next_smaller(common), _next_smaller(common[::-1])
    shared: list[list[SharedPrefix]] = [[] for _ in prompts]
    for position, index in enumerate(order):
        lengths = _falling(common, right, position) | _falling(common[::-1], left, len(order) - 1 - position)
        shared[index] = [SharedPrefix(prefix_tokens=length, sha256=token_ids_sha256(prompts[index][:length]))
                         for length in sorted(lengths)]
    return shared


def _common_length(first: TokenIds, second: TokenIds) -> int:
    length = min(len(first), len(second))
    differ = np.flatnonzero(np.asarray(first[:length]) != np.asarray(second[:length]))
    return int(differ[0]) if differ.size else length


def _next_smaller(values: list[int]) -> list[int | None]:
    """For each position, the next one to its right holding a smaller value (None: none does)."""
    found: list[int | None] = [None] * len(values)
    waiting: list[int] = []
    for position, value in enumerate(values):
        while waiting and values[waiting[-1]] > value:
            found[waiting.pop()] = position
        waiting.append(position)
    return found


def _falling(common: list[int], next_smaller: list[int | None], position: int) -> set[int]:
    """The distinct common lengths of the prompt at `position` with those after it (common[position] is its
    length with the next one), leaving out none shared."""
    lengths: set[int] = set()
    step: int | None = position if position < len(common) else None
    while step is not None and common[step] > 0:
        lengths.add(common[step])
        step = next_smaller[step]
    return lengths
