"""How vLLM holds a checkpoint's MXFP4 experts on one GPU, by release and GPU: the MoE backend it picks and
that backend's padded, swizzled tensors, as "Model loading took" counts them (live allocated bytes).

Read in every wheel from 0.12.0 to 0.34.0: quantization/mxfp4.py (0.12-0.18) and fused_moe/oracle/mxfp4.py
(0.19 on) choose the backend; quantization/utils/mxfp4_utils.py `_swizzle_mxfp4` and the vendored
triton_kernels' hopper_value.py and hopper_scale.py lay the Triton kernel's tensors out.

- Hopper (compute capability 9.0), from 0.12 (triton_kernels vendored; before, a separate install): the Triton
  kernel. The per-rank intermediate size is padded to 64 and the hidden size not at all; each expert's packed
  values are swizzled with their rows padded to 16 and their packed columns to 32 (both to 64 in 0.17-0.21);
  the scales are swizzled with rows padded to 256 (eight warps) and columns to 2 (to 4 from 0.26), and the
  loaded scales stay registered beside them until 0.25 frees them; the biases become float32.
- Blackwell (10.0) with FlashInfer: its TRT-LLM MXFP4 kernel, the intermediate size padded to 256 (128 from
  0.27) and the hidden size to 256, a scale byte per 32 weights, float32 biases and three float32 vectors of
  the experts. Which one runs depends on the install (FlashInfer's kernels or nvcc must be there): assumed so.
- Every other GPU, every release before 0.12, and a GPU the catalogue cannot name: the Marlin kernel, the
  intermediate size padded to 128 and the hidden size to 256, a scale byte per 32 weights, 16-bit biases.

Checked against a real start: gpt-oss-120b at TP 2 on H200s under 0.15.1 ("Using Triton backend") logs 32.98
GiB; these tensors and the rest of the model give 32.90 GiB (Marlin's layout would give 34.33).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from packaging.version import Version

from harness.predict.gpu_catalog import is_blackwell_datacentre, is_hopper, known_gpu
from harness.units import round_up

TRITON_VENDORED_SINCE = Version("0.12")
HOPPER_VALUES_PADDED_TO_64 = (Version("0.17"), Version("0.22"))
HOPPER_SCALES_FREED_SINCE = Version("0.25")
HOPPER_SCALE_COLUMNS_TO_4_SINCE = Version("0.26")
TRTLLM_INTERMEDIATE_TO_128_SINCE = Version("0.27")
HOPPER_SCALE_ROWS = 2 * 8 * 2 * 8  # HopperMXScaleLayout's row alignment with num_warps 8
BLOCK = 32  # weights per MXFP4 scale


class ExpertShape(NamedTuple):
    """One rank's share of one MoE layer's experts."""

    experts: int
    intermediate: int  # the per-rank intermediate size before padding
    hidden: int


class Mxfp4Layout(NamedTuple):
    """The MoE kernel vLLM runs MXFP4 experts with ("triton", "trtllm" or "marlin"), under this release."""

    backend: str
    engine_version: Version


MARLIN = Mxfp4Layout("marlin", TRITON_VENDORED_SINCE)  # Marlin's layout is the same in every release


def mxfp4_layout(engine_version: Version, gpu_name: str | None, total_bytes: int | None = None) -> Mxfp4Layout:
    """The kernel, and so the layout, this release picks on this GPU (by its name as the catalogue or nvidia-smi
    spells it, else by its total)."""
    gpu = known_gpu(gpu_name, total_bytes)
    capability = gpu.compute_capability if gpu is not None else None
    if engine_version < TRITON_VENDORED_SINCE:
        return MARLIN
    if capability == "9.0" or is_hopper(gpu_name):
        return Mxfp4Layout("triton", engine_version)
    if capability == "10.0" or is_blackwell_datacentre(gpu_name):
        return Mxfp4Layout("trtllm", engine_version)
    return MARLIN


def expert_layer_bytes(layout: Mxfp4Layout, shape: ExpertShape) -> int:
    """Bytes one MoE layer's experts hold on one rank in `layout`."""
    backend, engine_version = layout
    if backend == "triton":
        return _hopper_triton_bytes(shape, engine_version)
    multiple = 128 if backend == "marlin" or engine_version >= TRTLLM_INTERMEDIATE_TO_128_SINCE else 256
    width, hidden = round_up(shape.intermediate, multiple), round_up(shape.hidden, 256)
    weights = 3 * width * hidden  # gate and up (2 × width rows) and down, over the padded hidden size
    bias_bytes = 2 if backend == "marlin" else 4
    extra = 0 if backend == "marlin" else 3 * 4  # TRT-LLM's three float32 vectors, one entry an expert
    return shape.experts * (weights // 2 + weights // BLOCK + bias_bytes * (2 * width + hidden) + extra)


def _hopper_triton_bytes(shape: ExpertShape, engine_version: Version) -> int:
    width, hidden = round_up(shape.intermediate, 64), shape.hidden
    rows, columns = (64, 64) if HOPPER_VALUES_PADDED_TO_64[0] <= engine_version < HOPPER_VALUES_PADDED_TO_64[1] \
        else (16, 32)
    values = (round_up(2 * width, rows) * round_up(hidden // 2, columns)
              + round_up(hidden, rows) * round_up(width // 2, columns))
    scale_columns = 4 if engine_version >= HOPPER_SCALE_COLUMNS_TO_4_SINCE else 2
    swizzled = (round_up(2 * width, HOPPER_SCALE_ROWS) * round_up(math.ceil(hidden / BLOCK), scale_columns)
                + round_up(hidden, HOPPER_SCALE_ROWS) * round_up(math.ceil(width / BLOCK), scale_columns))
    loaded = 0 if engine_version >= HOPPER_SCALES_FREED_SINCE else (2 * width * hidden + hidden * width) // BLOCK
    return shape.experts * (values + swizzled + loaded + 4 * (2 * width + hidden))


def describe(layout: Mxfp4Layout) -> str:
    """The layout in words, for the weights term's source."""
    backend, engine_version = layout
    if backend == "triton":
        kept = "" if engine_version >= HOPPER_SCALES_FREED_SINCE else ", the loaded scales kept beside them"
        return (f"held as vLLM {engine_version}'s Triton MoE kernel lays them out on Hopper (the intermediate size "
                f"padded to 64, values and scales swizzled{kept}, float32 biases)")
    if backend == "trtllm":
        return (f"held as vLLM {engine_version}'s FlashInfer TRT-LLM MoE kernel lays them out on Blackwell (padded "
                "widths, float32 biases; assumes FlashInfer's kernels are installed, else Triton's layout applies)")
    return ("held as vLLM's Marlin MoE kernel lays them out (each rank's expert width rounded up to 128 and the "
            "hidden size to 256, 16-bit biases)")
