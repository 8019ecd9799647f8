"""The sampler's warm-up after the cache is sized: a start can size its cache and still die in it.

V1's `compile_or_warm_up_model` (gpu_worker.py; read in a 0.9 copy and in 0.32) runs, after the KV cache is
allocated and the CUDA graphs are captured, `_dummy_run(num_tokens=min(max_num_seqs, max_num_batched_tokens))`
and `_dummy_sampler_run` over that many rows ("Warm up sampler and preallocate memory buffer for logits …";
an out-of-memory there is "CUDA out of memory occurred when warming up sampler with N dummy requests"). What is
left for it is the device's total less what stays allocated: weights, non-torch memory, the KV cache and the
graphs. Since KV = total × utilisation − the subtracted terms, that is total × (1 − utilisation) + the activation
peak, less the graphs where the release does not reserve them before the cache (before 0.21).

The answer: "does not fit" when the warm-up needs more than is left; "at risk" when it would not fit if the CUDA
graphs took twice their estimate — the graph figure is fitted (a median), and the field corpus logs it up
to 6.03 GiB, so the margin is named with the figure; "fits" otherwise. V0 has no warm-up after the cache.
"""

from __future__ import annotations

from typing import Literal

from packaging.version import Version
from pydantic import BaseModel, ConfigDict

from harness.predict.activation import sampler_peak_bytes
from harness.predict.memory_model import FITTED_CONSTANTS, Waterfall
from harness.predict.parameter_count import ModelSize
from harness.units import GiB

WARMUP_AFTER_CACHE_SINCE = Version("0.8")  # the V1 engine; V0 captures graphs after the cache, no sampler


class WarmupCheck(BaseModel):
    """The warm-up's need against what the cache and the graphs leave, per GPU."""

    model_config = ConfigDict(extra="forbid")

    rows: int
    needed_bytes: int
    left_bytes: int
    cuda_graph_bytes: int  # the estimate (or the logged figure) the margin is judged against
    cuda_graph_source: str
    verdict: Literal["fits", "at risk", "does not fit"]
    note: str


def check_warmup(waterfall: Waterfall, size: ModelSize, *, v0: bool,
                 logged_graph_bytes: int | None = None) -> WarmupCheck | None:
    """None where the release runs no sampler warm-up after the cache (V0) or nothing was left for the cache."""
    if v0 or Version(waterfall.engine_version) < WARMUP_AFTER_CACHE_SINCE or waterfall.sampler is None \
            or waterfall.kv_bytes <= 0:
        return None
    rows = waterfall.sampler_rows  # V1 profiles min(max_num_seqs, max_num_batched_tokens) rows, as the warm-up samples
    needed = sampler_peak_bytes(size, rows, rows, waterfall.sampler.priced(FITTED_CONSTANTS.sampler_bytes_per_logit))
    terms = {term.name: term for term in waterfall.terms}
    graphs = terms["cuda_graphs"]
    graph_bytes, graph_source = (graphs.bytes, "fitted estimate") if logged_graph_bytes is None \
        else (logged_graph_bytes, "as logged")
    left = waterfall.total_bytes - waterfall.usable_bytes + terms["activation_peak"].bytes
    if not graphs.subtracted:  # captured out of what the cache left, not reserved before it
        left -= graph_bytes
    verdict: Literal["fits", "at risk", "does not fit"] = "fits"
    if needed > left:
        verdict = "does not fit"
    elif needed > left - graph_bytes:
        verdict = "at risk"
    note = (f"the sampler's warm-up after the cache ({rows:,} rows × {size.vocab:,} logits, "
            f"{waterfall.sampler.path}) needs {needed / GiB:.2f} GiB; {left / GiB:.2f} GiB are left after the "
            f"weights, the cache and {graph_bytes / GiB:.2f} GiB of CUDA graphs ({graph_source})")
    return WarmupCheck(rows=rows, needed_bytes=needed, left_bytes=left, cuda_graph_bytes=graph_bytes,
                       cuda_graph_source=graph_source, verdict=verdict, note=note)
