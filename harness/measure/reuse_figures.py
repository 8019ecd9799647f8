"""Prefix-cache reuse in a finished run: the counters' growth, the prediction for the requests the server
took, and per-turn latency and reuse for conversations."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from harness.inventory.frozen import Inventory
from harness.inventory.segments import sent_prompts
from harness.measure.client import RequestRecord
from harness.measure.record import ServerSample
from harness.measure.reuse_models import PrefixCacheFigures, TurnFigures
from harness.measure.stats import ttft_ms
from harness.observe.server_metrics import label_count
from harness.predict.prefix_cache import predict_prefix_hits


def reuse_figures(
    inventory: Inventory, records: Sequence[RequestRecord], samples: Sequence[ServerSample]
) -> tuple[PrefixCacheFigures, list[TurnFigures]]:
    """The requests the server admitted (it reported their usage) in the order they were sent, warm-up
    included: the counters count every one of them."""
    snapshots = [sample.snapshot for sample in samples if sample.snapshot is not None]
    config = next((s.cache_config for s in reversed(snapshots) if s.cache_config), None) or {}
    block_size, cache_blocks = cache_geometry(config)
    taken = sorted((r for r in records if r.prompt_tokens is not None), key=lambda r: (r.dispatch_s, r.index))
    if config.get("enable_prefix_caching") == "False":  # vLLM then neither looks up nor counts
        taken = []
    sent = sent_prompts(inventory, [(r.prompt_id, r.output_tokens or 0) for r in taken])
    prediction = predict_prefix_hits(sent, block_size, cache_blocks) if block_size else None
    measured_hits = _growth([s.prefix_cache_hits_total for s in snapshots])
    reported = [r.cached_prompt_tokens for r in taken if r.cached_prompt_tokens is not None]
    figures = PrefixCacheFigures(
        block_size_tokens=block_size,
        cache_blocks=cache_blocks,
        queried_tokens_measured=_growth([s.prefix_cache_queries_total for s in snapshots]),
        hit_tokens_measured=measured_hits,
        queried_tokens_predicted=sum(prompt.prompt_tokens for prompt in sent),
        hit_tokens_predicted=prediction.hit_tokens if prediction else None,
        hit_tokens_reported=sum(reported) if reported else None,
        eviction_possible=prediction.eviction_possible if prediction else None,
        hits_as_predicted=None if prediction is None or measured_hits is None
        else measured_hits == prediction.hit_tokens,
    )
    predicted = dict(zip((r.index for r in taken), prediction.hit_tokens_by_request, strict=True)) if prediction else {}
    return figures, turn_figures(records, predicted)


def turn_figures(records: Sequence[RequestRecord], predicted_hits: dict[int, int]) -> list[TurnFigures]:
    """Per turn number, the measured conversation turns that succeeded; `predicted_hits` by request index."""
    by_turn: dict[int, list[RequestRecord]] = defaultdict(list)
    for record in records:
        if record.turn is not None and not record.warmup and record.error_class is None and record.first_token_s:
            by_turn[record.turn].append(record)
    figures = []
    for turn, ok in sorted(by_turn.items()):
        ttfts = np.asarray([ttft_ms(r) for r in ok])
        figures.append(TurnFigures(
            turn=turn,
            requests_ok=len(ok),
            prompt_tokens_mean=_mean([r.prompt_tokens for r in ok]),
            ttft_ms_mean=float(ttfts.mean()),
            ttft_ms_p50=float(np.percentile(ttfts, 50)),
            ttft_ms_p99=float(np.percentile(ttfts, 99)),
            hit_tokens_predicted_mean=_mean([predicted_hits.get(r.index) for r in ok]),
            cached_prompt_tokens_mean=_mean([r.cached_prompt_tokens for r in ok]),
        ))
    return figures


def cache_geometry(config: dict[str, str]) -> tuple[int | None, int | None]:
    """Block size and usable blocks from vllm:cache_config_info's labels (block 0 is vLLM's null block)."""
    block_size = label_count(config.get("block_size"))
    blocks = label_count(config.get("num_gpu_blocks"))
    return block_size, None if blocks is None else blocks - 1


def _growth(values: list[int | None]) -> int | None:
    present = [value for value in values if value is not None]
    return present[-1] - present[0] if present else None


def _mean(values: Sequence[int | float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return float(np.mean(present)) if present else None
