"""GPU memory as vLLM sees it: the total CUDA reports, which is less than the card's printed size.

vLLM multiplies this total (not the marketing size) by `gpu_memory_utilization`, so only figures a
real start-up log or CUDA error printed are listed, each with where it was printed. A GPU that is
not here is refused by name; `--gpu-memory-gib` takes any other figure.
"""

from __future__ import annotations

from pydantic import BaseModel

from harness.errors import HarnessError


class GpuMemory(BaseModel, frozen=True):
    name: str
    total_gib: float  # as printed with two decimals, e.g. `total_gpu_memory (23.58GiB)`
    source: str


GPUS = {
    gpu.name: gpu
    for gpu in (
        GpuMemory(name="H100-80GB", total_gib=79.22,
                  source="`total_gpu_memory 79.22GiB`, https://github.com/vllm-project/vllm/pull/10511"),
        GpuMemory(name="L40S", total_gib=44.42,
                  source="`total_gpu_memory (44.42GiB)`, https://github.com/vllm-project/vllm/issues/15815"),
        GpuMemory(name="RTX-3090", total_gib=23.58,
                  source="`total_gpu_memory=23.58GiB`, https://github.com/vllm-project/vllm/issues/10517"),
        GpuMemory(name="A10-24GB", total_gib=22.18,
                  source="`a total capacity of 22.18 GiB`, https://github.com/OpenBMB/MiniCPM-V/issues/640"),
    )
}


def gpu_memory(name: str) -> GpuMemory:
    """The catalogue entry for a GPU name, matched without regard to case."""
    for known, gpu in GPUS.items():
        if known.lower() == name.lower():
            return gpu
    raise HarnessError(
        f"GPU '{name}' has no sourced memory figure here (known: {', '.join(GPUS)}); "
        "give its total as vLLM logs it with --gpu-memory-gib"
    )
