"""Will it fit? The before-launch waterfall for one model on one GPU, and the answer in words.

The waterfall runs from the GPU's total through the utilisation and each term vLLM subtracts to the
KV memory; the release's own block arithmetic then turns that into tokens, into whether one request
of `max_model_len` fits (vLLM refuses to start otherwise) and into how many sequences of the asked
length it holds at once.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

from pydantic import BaseModel
from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness.errors import HarnessError
from harness.predict.budget import MAX_MEMORY_GIB, CapacityPrediction
from harness.predict.budget_table import binary_size
from harness.predict.cache_margin import CacheMargin, cache_margin
from harness.predict.engine_launch import EngineLaunch
from harness.predict.gpu_catalog import gpu_memory
from harness.predict.memory_model import FITTED_CONSTANTS, Waterfall, plan_waterfall
from harness.predict.model_shape import ModelShape
from harness.predict.parameter_count import model_size
from harness.predict.pipeline import predict_pipeline_capacity
from harness.predict.releases import engine_release, runs_v0
from harness.predict.warmup import WarmupCheck, check_warmup
from harness.units import GiB


class FitAnswer(BaseModel):
    waterfall: Waterfall
    capacity: CapacityPrediction
    asked_tokens: int
    sequences_of_asked_length: int
    max_num_seqs: int | None
    fits: bool
    verdict: Literal["fits", "at risk", "does not fit"]
    cache_margin: CacheMargin  # one request's room in the cache against the calculator's error band
    warmup: WarmupCheck | None = None  # the sampler's warm-up after the cache (V1), and whether it has room
    answer: str


def answer_fit(
    shape: ModelShape,
    launch: EngineLaunch,
    *,
    gpu: str,
    asked_tokens: int | None,
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    prefix_caching: bool = False,
    decode_context_parallel_size: int = 1,
) -> FitAnswer:
    """The waterfall for `gpu` (a catalogue name or a GiB figure) under `launch`, and what it means for the limits;
    the rest are the block arithmetic's, which the waterfall does not read."""
    total, total_source = gpu_total(gpu)
    model_len = launch.max_model_len
    checkpoint = None if launch.quantization else shape.checkpoint_weights
    waterfall = plan_waterfall(shape.config, FITTED_CONSTANTS, launch, total_bytes=total, total_source=total_source,
                               gpu_name=gpu, checkpoint=checkpoint, config_source=shape.source)
    stage_kv_bytes = [max(0, stage) for stage in waterfall.stage_kv_bytes]
    predict = partial(predict_pipeline_capacity, shape, stage_kv_bytes, block_size=block_size,
                      kv_cache_dtype=kv_cache_dtype, tensor_parallel_size=launch.tensor_parallel_size,
                      max_num_batched_tokens=launch.max_num_batched_tokens, engine_version=launch.engine_version,
                      available_kv_source="before-launch waterfall", speculative=launch.speculative,
                      prefix_caching=prefix_caching, decode_context_parallel_size=decode_context_parallel_size)
    capacity = predict(max_model_len=model_len)
    asked = asked_tokens or model_len
    at_asked = predict(max_model_len=asked)
    cache_fits = capacity.num_blocks > 0 and capacity.num_blocks >= capacity.blocks_per_request
    warmup = check_warmup(waterfall, model_size(shape.config, shape.source),
                          v0=runs_v0(engine_release(launch.engine_version), launch.engine_generation))
    fits = cache_fits and (warmup is None or warmup.verdict != "does not fit")
    margin = cache_margin(capacity, waterfall.usable_bytes, FITTED_CONSTANTS.kv_error_share)
    at_risk = margin.at_risk or (warmup is not None and warmup.verdict == "at risk")
    sequences = at_asked.whole_sequences_at_max_model_len
    answer = _words(waterfall, capacity, cache_fits, asked, sequences, launch.max_num_seqs)
    if margin.at_risk:
        answer = f"at risk: {_margin_words(margin, capacity)} ({answer})"
    if cache_fits and warmup is not None and warmup.verdict != "fits":
        answer = f"{warmup.verdict}: {warmup.note}" + ("" if not fits else f" (the cache itself: {answer})")
    return FitAnswer(waterfall=waterfall, capacity=capacity, asked_tokens=asked, sequences_of_asked_length=sequences,
                     max_num_seqs=launch.max_num_seqs, fits=fits,
                     verdict="does not fit" if not fits else "at risk" if at_risk else "fits",
                     cache_margin=margin, warmup=warmup, answer=answer)


def gpu_total(gpu: str) -> tuple[int, str]:
    """A catalogue GPU's total, or a figure in GiB given directly."""
    try:
        # float() would also read full-width digits ('１２') and digit groups ('1_000')
        gib = float(gpu) if gpu.isascii() and "_" not in gpu else math.nan
    except ValueError:
        entry = gpu_memory(gpu)
        return int(entry.total_gib * GiB), f"{entry.name}: {entry.source}"
    if not (0 < gib <= MAX_MEMORY_GIB):
        raise HarnessError(f"--gpu must be a GPU name or a number of GiB from 0 to {MAX_MEMORY_GIB:,}, got {gpu}")
    return int(gib * GiB), f"{gib} GiB as given"


def _words(waterfall: Waterfall, capacity: CapacityPrediction, fits: bool, asked: int, sequences: int,
           max_num_seqs: int | None) -> str:
    kv_memory = _binding_kv_memory(waterfall, capacity)
    if min(waterfall.stage_kv_bytes) <= 0:
        return (f"does not fit: nothing is left for the KV cache ({kv_memory} after the terms above); "
                "vLLM stops with 'No available memory for the cache blocks'")
    if not fits:
        return (f"does not fit: {kv_memory} holds {capacity.kv_cache_tokens:,} tokens, less than one request "
                f"of max_model_len {capacity.max_model_len:,}; vLLM refuses to start")
    capped = max_num_seqs is not None and max_num_seqs < sequences
    cap = f"; vLLM runs at most max_num_seqs={max_num_seqs} at once" if capped else ""
    return (f"fits: {kv_memory}, {capacity.kv_cache_tokens:,} tokens; "
            f"{sequences:,} sequence{'' if sequences == 1 else 's'} of {asked:,} tokens at once{cap}")


def _margin_words(margin: CacheMargin, capacity: CapacityPrediction) -> str:
    return (f"the cache holds one request of {capacity.max_model_len:,} tokens with {binary_size(margin.margin_bytes)} "
            f"to spare, less than this calculator's error band here ({binary_size(margin.band_bytes)}, "
            f"{FITTED_CONSTANTS.kv_error_share:.1%} of usable memory: its KV memory misses by more on one in ten of "
            "the field corpus's fit cases)")


def _binding_kv_memory(waterfall: Waterfall, capacity: CapacityPrediction) -> str:
    """The KV memory the tokens come from: with pipeline stages, the stage with fewest blocks' own, not the
    even split the waterfall's '= KV memory' row shows."""
    if len(waterfall.stage_kv_bytes) == 1:
        return f"{binary_size(waterfall.kv_bytes)} of KV memory"
    binding = capacity.available_kv_bytes if min(waterfall.stage_kv_bytes) > 0 else min(waterfall.stage_kv_bytes)
    return f"{binary_size(binding)} of KV memory on the binding pipeline stage (the one with fewest blocks)"


def answer_renderable(answer: FitAnswer) -> Group:
    water = answer.waterfall
    table = Table("step", "GiB", "source", title=f"Memory waterfall per GPU (vLLM {water.engine_version})")
    table.add_row("total", f"{water.total_bytes / GiB:.2f}", water.total_source)
    table.add_row(f"× gpu_memory_utilization {water.gpu_memory_utilization}", f"{water.usable_bytes / GiB:.2f}", "")
    for term in water.terms:
        sign = "−" if term.subtracted else "(not subtracted)"
        table.add_row(f"{sign} {term.name}", f"{term.bytes / GiB:.2f}", term.source)
    table.add_row("= KV memory", f"{water.kv_bytes / GiB:.2f}", "what the KV cache is sized from", style="bold")
    table.add_row("KV cache", f"{answer.capacity.kv_cache_tokens:,} tokens",
                  f"{answer.capacity.num_blocks:,} blocks of {answer.capacity.block_size}")
    notes = Table(show_header=False, box=None)
    for note in [*water.assumptions, *answer.capacity.assumptions]:
        notes.add_row("•", note)
    style = {"does not fit": "bold red", "at risk": "bold yellow", "fits": "bold green"}[answer.verdict]
    return Group(table, notes, Text(answer.answer, style=style))
