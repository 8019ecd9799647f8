"""GPU memory as vLLM sees it: the total CUDA reports, which is less than the card's printed size.

vLLM multiplies this total (not the marketing size) by `gpu_memory_utilization`, so figures a real
start-up log or CUDA error printed come first (torch's out-of-memory message prints the same device total
vLLM reads, `a total capacity of X GiB`). Where no such figure was found, nvidia-smi's
`memory.total` stands in and its source says so: it is the larger of the two (an H100 shows
81,559 MiB = 79.65 GiB in nvidia-smi but 79.11-79.22 GiB in vLLM's logs), so those entries
overstate the total by about half a GiB. A GPU that is not here is refused by name;
`--gpu-memory-gib` takes any other figure.
"""

from __future__ import annotations

from pydantic import BaseModel

from harness.errors import HarnessError

NVIDIA_SMI_TOTALS = "https://github.com/modal-labs/modal-client/pull/2797"


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
        GpuMemory(name="RTX-4090", total_gib=23.64,
                  source="torch's `a total capacity of 23.64 GiB`, https://github.com/ali-vilab/VGen/issues/104"),
        GpuMemory(name="RTX-5090", total_gib=31.36,
                  source="torch's `a total capacity of 31.36 GiB`, "
                         "https://github.com/TrajectoryCrafter/TrajectoryCrafter/issues/20"),
        GpuMemory(name="T4", total_gib=14.58,
                  source="torch's `a total capacty of 14.58 GiB` on a Tesla T4, "
                         "https://github.com/datawhalechina/self-llm/issues/162"),
        GpuMemory(name="A100-80GB", total_gib=80.0,
                  source=f"nvidia-smi `81920MiB`, {NVIDIA_SMI_TOTALS} (nvidia-smi's total, above CUDA's)"),
        GpuMemory(name="A100-40GB", total_gib=40.0,
                  source=f"nvidia-smi `40960MiB`, {NVIDIA_SMI_TOTALS} (nvidia-smi's total, above CUDA's)"),
        GpuMemory(name="L4", total_gib=22.49,
                  source=f"nvidia-smi `23034MiB`, {NVIDIA_SMI_TOTALS} (nvidia-smi's total, above CUDA's)"),
        GpuMemory(name="H200", total_gib=140.4,
                  source="nvidia-smi `~143,771 MiB per GPU`, https://github.com/vllm-project/recipes/issues/381 "
                         "(nvidia-smi's total, above CUDA's)"),
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
