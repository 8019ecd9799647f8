"""The run summary's figures on prefix-cache reuse: predicted against measured, and per conversation turn."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

OUTPUT_PREFIX = "prefix_cache_"  # one dashboard output per figure: an output holds no nested object


class PrefixCacheFigures(BaseModel):
    """vLLM's prefix-cache counters over the run beside what the prediction (`predict.prefix_cache`) expected
    of the requests the server took. The prediction assumes a cache that held none of the run's prompts when
    it started: a run after an unsalted run of the same inventory measures more."""

    model_config = ConfigDict(extra="forbid")

    block_size_tokens: int | None = Field(description="from vllm:cache_config_info; None: not exported")
    cache_blocks: int | None = Field(description="usable KV-cache blocks (the null block left out)")
    queried_tokens_measured: int | None = Field(description="growth of vllm:prefix_cache_queries")
    hit_tokens_measured: int | None = Field(description="growth of vllm:prefix_cache_hits")
    queried_tokens_predicted: int
    hit_tokens_predicted: int | None = Field(description="None without a block size")
    hit_tokens_reported: int | None = Field(description="sum of the responses' usage cached_tokens, when sent")
    eviction_possible: bool | None = Field(description="True: the blocks needed exceed the cache, and "
                                           "hit_tokens_predicted is an upper bound")
    hits_as_predicted: bool | None = Field(description="hit_tokens_measured == hit_tokens_predicted")

    def outputs(self) -> dict[str, Any]:
        """Each figure the run got, under its dashboard name `prefix_cache_<name>`."""
        return {f"{OUTPUT_PREFIX}{name}": value for name, value in self.model_dump(exclude_none=True).items()}

    @classmethod
    def output_names(cls) -> set[str]:
        return {f"{OUTPUT_PREFIX}{name}" for name in cls.model_fields}


class TurnFigures(BaseModel):
    """One turn number across the run's conversations: its latency and how much of its prompt was reused."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    requests_ok: int
    prompt_tokens_mean: float | None
    ttft_ms_mean: float | None
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    hit_tokens_predicted_mean: float | None
    cached_prompt_tokens_mean: float | None = Field(description="from the responses' usage, when sent")
