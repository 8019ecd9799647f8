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
  importable and not disabled (`VLLM_USE_FLASHINFER_SAMPLER is not False`) in 0.9.0 … 0.11.0 (0.8.5 takes it
  only from a FlashInfer before 0.2.3), only with VLLM_USE_FLASHINFER_SAMPLER=1 from 0.11.1 (the log then says
  "Using FlashInfer"; read in 0.8.5, 0.9.0, 0.9.2, 0.10.0, 0.11.0, 0.11.1 and 0.11.2); from 0.22
  a second warm-up call with a seeded generator runs the native path anyway (`forward_cuda` falls
  back when `generators` is set), which is Triton's 14 B again;
- the second GPU model runner (gpu/model_runner.py `_dummy_sampler_run`, model_runner.py says which starts
  take it) warms up on `InputBatch.make_dummy`, whose requests keep the sampling states' initial values: greedy,
  top-k the vocabulary, top-p 1, and `gumbel_sample` keeps two small per-block buffers. Until 0.25
  `Sampler.apply_sampling_params` copies the logits to fp32 first (2 + 4 B); 0.26 works on them in place and 0.27
  skips a batch that asks for nothing: the model-dtype logits alone, 2 B (read in 0.22 … 0.32). Two 0.27 and
  0.30 starts log 0.08 and 0.15 GiB of activation where the first runner's Triton path would have held 0.51;
- the PyTorch sort (`apply_top_k_top_p_pytorch`: `logits.sort` values 4 B and int64 indices 8 B,
  the masks, the sorted softmax) is V1's native path before 0.17 and V0's always (V0 sampler.py
  `_apply_top_k_top_p`); its peak includes the sort's own scratch inside PyTorch, which vLLM's code
  does not state, so it is the one fitted figure (`MemoryConstants.sampler_bytes_per_logit`).

Measured on an H200 with torch 2.11 (benchmarks/gpu_memory_terms.py), the sort path peaks inside the sort at
38.0 B per logit (the 2 + 4 B logits, 4 B values and 8 B indices out, 20 B of the sort's scratch) for 1 and
for 128 to 2,048 rows of 32,000 to 262,144 entries, and Triton's path at 14.0, as the code gives. From 2 to
96 rows it peaked at 50.2 to 51.1 B: PyTorch's `launch_stable_sort_kernel` (aten SortStable.cu) sorts fewer
than 128 rows as one flattened array (`segmented_sort_pairs_by_full_sort`: two 8 B (index, segment) buffers,
a 4 B keys copy and the radix sort's 4 + 8 B alternates, against the 8 B reverse indices and 4 + 8 B
alternates of `segmented_sort_pairs`), 12 B more per logit, which is added to the fitted figure there.
Four V0 profiles of the corpus imply 38.2 to 39.2 B for the sort. The fit sits lower: priced at 38.0, the
held-back V1 0.10 Qwen3-30B-A3B start would leave less KV memory than it logged (its log leaves 1.33 GiB for the
activation and non-torch memory, where 38.0 B alone make 1.38), so the sort of that release's torch may hold
less, or another term be over; the fitted figure stays until one of them is shown.
"""

from __future__ import annotations

from packaging.version import Version
from pydantic import BaseModel

from harness.predict.releases import runs_v0

TRITON_SINCE = Version("0.17")
FLASHINFER_WHEN_IMPORTABLE_SINCE = Version("0.9.0")
FLASHINFER_OPT_IN_SINCE = Version("0.11.1")
SECOND_WARMUP_SINCE = Version("0.22")  # `_dummy_sampler_run` samples again with a seeded generator
TRITON_ANY_ROWS_SINCE = Version("0.30")
TRITON_MIN_ROWS = 8  # before 0.30, `apply_top_k_top_p` sorts batches of fewer rows
V1_LOGITS_BYTES = 2 + 4  # the model-dtype logits and Sampler.forward's fp32 copy
NATIVE_AFTER_MASK_BYTES = 4 + 4  # forward_native's fp32 softmax and random_sample's exponential draws
TRITON_BYTES_PER_LOGIT = V1_LOGITS_BYTES + NATIVE_AFTER_MASK_BYTES  # 14
FLASHINFER_BYTES_PER_LOGIT = V1_LOGITS_BYTES + 4 + 4  # 14: the top-k-masked copy and its softmax
SECOND_RUNNER_IN_PLACE_SINCE = Version("0.26")  # the second runner no longer copies the logits to fp32
SECOND_RUNNER_BYTES_PER_LOGIT = 2  # the model-dtype logits of a greedy batch
FULL_SORT_ROWS = range(2, 128)  # rows PyTorch's sort flattens into one array (more than one, fewer than 128)
FULL_SORT_EXTRA_BYTES_PER_LOGIT = 2 * 8 + 4 + 4 + 8 - (8 + 4 + 8)  # 12 over the segmented sort's scratch


class SamplerPath(BaseModel, frozen=True):
    """One top-k/top-p implementation as a release runs it; `bytes_per_logit` None means the fitted sort, to
    which `sort_extra_bytes_per_logit` is added."""

    path: str  # "sort", "triton" or "flashinfer"
    bytes_per_logit: float | None
    origin: str
    sort_extra_bytes_per_logit: float = 0.0

    def priced(self, fitted_sort_bytes_per_logit: float) -> float:
        """Bytes per logit at the path's peak: the release's formula, or the fitted sort figure."""
        if self.bytes_per_logit is not None:
            return self.bytes_per_logit
        return fitted_sort_bytes_per_logit + self.sort_extra_bytes_per_logit


SORT_V0 = SamplerPath(path="sort", bytes_per_logit=None,
                      origin="V0 sampler.py _apply_top_k_top_p (0.6.3-0.10): full sort, fitted")
SORT_V1 = SamplerPath(path="sort", bytes_per_logit=None,
                      origin="V1 topk_topp_sampler.py apply_top_k_top_p (0.8.5-0.16; fewer than 8 rows to 0.29): "
                             "full sort, fitted")
TRITON = SamplerPath(path="triton", bytes_per_logit=TRITON_BYTES_PER_LOGIT,
                     origin="V1 topk_topp_triton.py apply_top_k_top_p_triton (0.17+): 2+4 logits, 4 softmax, "
                            "4 draws")
SECOND_RUNNER = SamplerPath(path="greedy", bytes_per_logit=SECOND_RUNNER_BYTES_PER_LOGIT,
                            origin="V1 gpu/model_runner.py _dummy_sampler_run (the second runner, 0.26+): a greedy "
                                   "batch without top-k/top-p, 2 logits")
SECOND_RUNNER_FP32 = SamplerPath(path="greedy", bytes_per_logit=V1_LOGITS_BYTES,
                                 origin="V1 gpu/model_runner.py _dummy_sampler_run (the second runner, 0.22-0.25): "
                                        "a greedy batch without top-k/top-p, 2+4 logits")
FLASHINFER = SamplerPath(path="flashinfer", bytes_per_logit=FLASHINFER_BYTES_PER_LOGIT,
                         origin="V1 topk_topp_sampler.py flashinfer_sample (0.8.5-0.21): 2+4 logits, 4 masked, "
                                "4 softmax")


def sampler_path(version: Version, engine_generation: str | None, sampler: str, rows: int,
                 second_runner: bool = False) -> SamplerPath:
    """The path a warm-up over `rows` takes: V0 sorts; V1 `sampler` is "flashinfer" or "pytorch" (native), unless
    the start profiles on the second model runner, whose greedy warm-up takes neither."""
    if runs_v0(version, engine_generation):
        return _sorting(SORT_V0, rows)
    if second_runner:
        return SECOND_RUNNER if version >= SECOND_RUNNER_IN_PLACE_SINCE else SECOND_RUNNER_FP32
    if sampler == "flashinfer" and version < SECOND_WARMUP_SINCE:
        return FLASHINFER
    # From 0.17 the native path masks in place (Triton); from 0.22 it runs after FlashInfer's call too.
    triton = version >= TRITON_SINCE and (rows >= TRITON_MIN_ROWS or version >= TRITON_ANY_ROWS_SINCE)
    return TRITON if triton else _sorting(SORT_V1, rows)


def _sorting(path: SamplerPath, rows: int) -> SamplerPath:
    """The sort path over `rows`: PyTorch flattens 2 to 127 rows into one sort, which holds 12 B more per logit."""
    if rows not in FULL_SORT_ROWS:
        return path
    return SamplerPath(path=path.path, bytes_per_logit=path.bytes_per_logit,
                       origin=f"{path.origin}, + {FULL_SORT_EXTRA_BYTES_PER_LOGIT} B for {rows} rows (PyTorch's "
                              "flattened sort)",
                       sort_extra_bytes_per_logit=FULL_SORT_EXTRA_BYTES_PER_LOGIT)


def release_default_sampler(version: Version) -> str | None:
    """The V1 sampler a CUDA install runs unless told otherwise, where the code alone decides it.

    From 0.11.1 FlashInfer is opt-in (VLLM_USE_FLASHINFER_SAMPLER=1), so the native path is the
    default whatever is installed; before, FlashInfer ran whenever importable, which the code cannot tell.
    """
    return "pytorch" if version >= FLASHINFER_OPT_IN_SINCE else None


def sampler_of_start(version: Version, named: str | None, flashinfer_loaded: bool) -> str | None:
    """The sampler a start's log establishes: the one a line names, else FlashInfer's where the start loaded
    FlashInfer (its attention backend) in a release that samples with it whenever importable; None if neither."""
    if named is not None:
        return named
    importable_default = FLASHINFER_WHEN_IMPORTABLE_SINCE <= version < FLASHINFER_OPT_IN_SINCE
    return "flashinfer" if flashinfer_loaded and importable_default else None
