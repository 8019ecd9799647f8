"""The sampler's warm-up peak per logit, by release and top-k/top-p path, read from each release's code.

vLLM's profiling run ends with one sampling step over its dummy requests, every row the whole
vocabulary with top-k = vocabulary − 1, top-p < 1 and a temperature set (V1 gpu_model_runner.py
`_dummy_sampler_run`, read in 0.8.5 … 0.33.0; V0 model_runner.py `_dummy_run`). What is alive at
the peak, per (row × vocabulary entry), on each path a CUDA install takes by default:

- everywhere in V1: the model-dtype logits `_dummy_sampler_run` keeps (2 B) and the fp32 copy
  `Sampler.forward` makes (`logits.to(torch.float32)`, 4 B); temperature is divided in place;
- after top-k/top-p, `TopKTopPSampler.forward_native` takes `softmax(dtype=float32)` (4 B) and
  `random_sample` an `empty_like` of it for the exponential draws (4 B): 14 B in all;
- Triton (`apply_top_k_top_p_triton`, topk_topp_triton.py, from 0.17; `apply_top_k_top_p` takes it
  when HAS_TRITON and at least 8 rows, read in 0.17 … 0.28, and whenever HAS_TRITON in 0.30 … 0.33;
  0.29 was not read and is taken as 0.28; fewer rows sort) masks the fp32 logits in
  place, so the native path peaks at those 14 B; its cached scratch of min(SMs, rows) rows is not
  counted (≤ 132 × 151,936 × 4 B = 0.07 GiB on an H100);
- FlashInfer (`flashinfer_sample` → `top_k_top_p_sampling_from_logits`) holds the top-k-masked
  copy and its softmax beside the two logits tensors: 2 + 4 + 4 + 4 = 14 B. It is taken when
  importable and not disabled in 0.8.5 … 0.11.0 (`VLLM_USE_FLASHINFER_SAMPLER is not False`), only
  with VLLM_USE_FLASHINFER_SAMPLER=1 from 0.11.2 (the log then says "Using FlashInfer"); from 0.22
  a second warm-up call with a seeded generator runs the native path anyway (`forward_cuda` falls
  back when `generators` is set), which is Triton's 14 B again;
- the PyTorch sort (`apply_top_k_top_p_pytorch`: `logits.sort` values 4 B and int64 indices 8 B,
  the masks, the sorted softmax) is V1's native path before 0.17 and V0's always (V0 sampler.py
  `_apply_top_k_top_p`); its peak includes the sort's own scratch inside PyTorch, which vLLM's code
  does not state, so it is the one fitted figure (`MemoryConstants.sampler_bytes_per_logit`).
"""

from __future__ import annotations

from packaging.version import Version
from pydantic import BaseModel

from harness.predict.releases import runs_v0

TRITON_SINCE = Version("0.17")
FLASHINFER_OPT_IN_SINCE = Version("0.11.2")
SECOND_WARMUP_SINCE = Version("0.22")  # `_dummy_sampler_run` samples again with a seeded generator
TRITON_ANY_ROWS_SINCE = Version("0.30")
TRITON_MIN_ROWS = 8  # before 0.30, `apply_top_k_top_p` sorts batches of fewer rows
V1_LOGITS_BYTES = 2 + 4  # the model-dtype logits and Sampler.forward's fp32 copy
NATIVE_AFTER_MASK_BYTES = 4 + 4  # forward_native's fp32 softmax and random_sample's exponential draws
TRITON_BYTES_PER_LOGIT = V1_LOGITS_BYTES + NATIVE_AFTER_MASK_BYTES  # 14
FLASHINFER_BYTES_PER_LOGIT = V1_LOGITS_BYTES + 4 + 4  # 14: the top-k-masked copy and its softmax


class SamplerPath(BaseModel, frozen=True):
    """One top-k/top-p implementation as a release runs it; `bytes_per_logit` None means the fitted sort."""

    path: str  # "sort", "triton" or "flashinfer"
    bytes_per_logit: float | None
    origin: str


SORT_V0 = SamplerPath(path="sort", bytes_per_logit=None,
                      origin="V0 sampler.py _apply_top_k_top_p (0.6.3-0.10): full sort, fitted")
SORT_V1 = SamplerPath(path="sort", bytes_per_logit=None,
                      origin="V1 topk_topp_sampler.py apply_top_k_top_p (0.8.5-0.16; fewer than 8 rows to 0.29): "
                             "full sort, fitted")
TRITON = SamplerPath(path="triton", bytes_per_logit=TRITON_BYTES_PER_LOGIT,
                     origin="V1 topk_topp_triton.py apply_top_k_top_p_triton (0.17+): 2+4 logits, 4 softmax, "
                            "4 draws")
FLASHINFER = SamplerPath(path="flashinfer", bytes_per_logit=FLASHINFER_BYTES_PER_LOGIT,
                         origin="V1 topk_topp_sampler.py flashinfer_sample (0.8.5-0.21): 2+4 logits, 4 masked, "
                                "4 softmax")


def sampler_path(version: Version, engine_generation: str | None, sampler: str, rows: int) -> SamplerPath:
    """The path a warm-up over `rows` takes: V0 sorts; V1 `sampler` is "flashinfer" or "pytorch" (native)."""
    if runs_v0(version, engine_generation):
        return SORT_V0
    if sampler == "flashinfer" and version < SECOND_WARMUP_SINCE:
        return FLASHINFER
    # From 0.17 the native path masks in place (Triton); from 0.22 it runs after FlashInfer's call too.
    triton = version >= TRITON_SINCE and (rows >= TRITON_MIN_ROWS or version >= TRITON_ANY_ROWS_SINCE)
    return TRITON if triton else SORT_V1


def release_default_sampler(version: Version) -> str | None:
    """The V1 sampler a CUDA install runs unless told otherwise, where the code alone decides it.

    From 0.11.2 FlashInfer is opt-in (VLLM_USE_FLASHINFER_SAMPLER=1), so the native path is the
    default whatever is installed; before, FlashInfer ran whenever importable, which the code cannot tell.
    """
    return "pytorch" if version >= FLASHINFER_OPT_IN_SINCE else None
