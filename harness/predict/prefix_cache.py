"""Prefix-cache hits predicted from what prompts share and the KV cache's geometry, before anything runs.

vLLM V1 (0.32, `v1/core/kv_cache_manager.py`) hashes a prompt in whole blocks, each hash chained to the one
before it, so a request reuses the longest run of leading full blocks an earlier request left in the cache;
a partial block is never shared. At least one prompt token is always computed (it gives the logits), so a
hit stops at the last full block before the prompt's last token. A request's blocks are entered in the cache
when the scheduler allocates them (`allocate_slots` → `cache_blocks`), before their prefill runs: a request
admitted while an earlier one's prefill is still under way, even in the same scheduler step, already hits the
blocks that earlier request was given. So in each group of prompts sharing a prefix exactly one request (the
first admitted) misses, whatever the client's concurrency. The counters (`vllm:prefix_cache_queries` and
`vllm:prefix_cache_hits`, tokens) count each request once, when admitted; a preempted request's second
lookup is kept apart and not exported.

A cached block stays until an allocation needs its memory: freed blocks are reused oldest first. When every
block the run's requests occupy, prompt and output, shared blocks once, fits the cache, none is reused and the
prediction is exact; beyond that, evictions are possible and the prediction is an upper bound.

A prompt is described by its segments: runs of tokens with a key that names their content (a group's prefix,
a conversation's earlier turns). Two prompts hold the same tokens as far as their segment keys agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PromptSegment(_Frozen):
    """A run of tokens; equal keys mean equal tokens."""

    key: str
    tokens: int = Field(gt=0)


class SentPrompt(_Frozen):
    """One request as the cache sees it: its prompt's segments and the output tokens it adds."""

    segments: list[PromptSegment] = Field(min_length=1)
    output_tokens: int = Field(0, ge=0)

    @property
    def prompt_tokens(self) -> int:
        return sum(segment.tokens for segment in self.segments)


class PrefixCachePrediction(_Frozen):
    """The counters' growth a run of these requests, in this order, should show."""

    block_size_tokens: int
    queried_tokens: int
    hit_tokens: int
    hit_tokens_by_request: list[int]
    blocks_needed: int = Field(description="blocks the requests occupy, shared prefix blocks once")
    cache_blocks: int | None = Field(None, description="usable blocks of the cache (its null block left out)")
    eviction_possible: bool | None = Field(None, description="True: hit_tokens is an upper bound; None: unknown")


def block_keys(prompt: SentPrompt, block_size_tokens: int) -> list[tuple]:
    """One key per full block of the prompt: everything up to the block's end, so equal keys mean equal
    chains of block hashes, as vLLM's are."""
    keys: list[tuple] = []
    whole: tuple[str, ...] = ()
    start = 0
    for segment in prompt.segments:
        end = start + segment.tokens
        boundary = (start // block_size_tokens + 1) * block_size_tokens
        while boundary <= end:
            keys.append((whole, segment.key, boundary - start))
            boundary += block_size_tokens
        whole = (*whole, segment.key)
        start = end
    return keys


def predict_prefix_hits(
    sent: Sequence[SentPrompt], block_size_tokens: int, cache_blocks: int | None = None
) -> PrefixCachePrediction:
    """Each request in admission order hits the leading full blocks some earlier request holds, up to the
    last full block before its final prompt token."""
    if block_size_tokens < 1:
        raise ValueError(f"block size {block_size_tokens} is not a positive number of tokens")
    cached: set[tuple] = set()
    hits: list[int] = []
    blocks_needed = 0
    for prompt in sent:
        keys = block_keys(prompt, block_size_tokens)
        limit = (prompt.prompt_tokens - 1) // block_size_tokens  # the last prompt token is always computed
        hit_blocks = 0
        while hit_blocks < limit and keys[hit_blocks] in cached:
            hit_blocks += 1
        hits.append(hit_blocks * block_size_tokens)
        total_blocks = -(-(prompt.prompt_tokens + prompt.output_tokens) // block_size_tokens)
        blocks_needed += total_blocks - hit_blocks  # a block recomputed after a hit's end takes new memory
        cached.update(keys)
    return PrefixCachePrediction(
        block_size_tokens=block_size_tokens,
        queried_tokens=sum(prompt.prompt_tokens for prompt in sent),
        hit_tokens=sum(hits),
        hit_tokens_by_request=hits,
        blocks_needed=blocks_needed,
        cache_blocks=cache_blocks,
        eviction_possible=None if cache_blocks is None else blocks_needed > cache_blocks,
    )
