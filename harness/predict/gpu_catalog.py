"""GPU memory as vLLM sees it: the total CUDA reports, which is less than the card's printed size.

vLLM multiplies this total (not the marketing size) by `gpu_memory_utilization`, so each figure here is one a
real start-up log, CUDA error or CUDA program printed (torch's out-of-memory message prints the same device
total vLLM reads, `a total capacity of X GiB`; older torch wrote `X GiB total capacity`), never nvidia-smi's
`memory.total`, which is larger (an H100 shows 81,559 MiB = 79.65 GiB in nvidia-smi but 79.11-79.22 GiB in
vLLM's logs; an H200 143,771 MiB = 140.40 GiB against vLLM's 139.81). The same card can print a slightly
different total under another driver or board (SXM or PCIe); a source names the other figure where one was seen.
A GB10 (DGX Spark) shares one memory between CPU and GPU, and CUDA's total is that whole memory. A GPU that is
not here is refused by name; `--gpu` also takes the total itself in GiB.

Each NVIDIA entry also gives the chip's streaming multiprocessors and compute capability (NVIDIA's product
specifications and architecture whitepapers), which size the CUDA context's local-memory reservation
(`non_torch.context_local_memory_bytes`); the resident threads per multiprocessor follow from the capability
(the CUDA C++ Programming Guide's "Technical Specifications per Compute Capability").
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from harness.errors import HarnessError
from harness.units import GiB

# Maximum resident threads per multiprocessor by compute capability (cudaDeviceProp.maxThreadsPerMultiProcessor).
RESIDENT_THREADS_PER_MULTIPROCESSOR = {"7.0": 2048, "7.5": 1024, "8.0": 2048, "8.6": 1536, "8.9": 1536, "9.0": 2048,
                                       "10.0": 2048, "12.0": 1536, "12.1": 1536}


class GpuMemory(BaseModel, frozen=True):
    name: str
    total_gib: float  # as printed with two decimals, e.g. `total_gpu_memory (23.58GiB)`
    source: str
    multiprocessor_count: int | None = None  # cudaDeviceProp.multiProcessorCount; None for a GPU that is not CUDA's
    compute_capability: str | None = None

    @property
    def resident_threads(self) -> int | None:
        """The most threads the whole GPU holds at once: what CUDA reserves each thread's local memory for."""
        if self.multiprocessor_count is None or self.compute_capability is None:
            return None
        return self.multiprocessor_count * RESIDENT_THREADS_PER_MULTIPROCESSOR[self.compute_capability]


GPUS = {
    gpu.name: gpu
    for gpu in (
        GpuMemory(name="H100-80GB", total_gib=79.22, multiprocessor_count=132, compute_capability="9.0",
                  source="`total_gpu_memory 79.22GiB`, https://github.com/vllm-project/vllm/pull/10511"),
        GpuMemory(name="H100-96GB", total_gib=94.50, multiprocessor_count=132, compute_capability="9.0",
                  source="torch's `a total capacity of 94.50 GiB` in a thread titled \"OOM error on 96GB H100\", "
                         "https://github.com/vllm-project/vllm/issues/9630"),
        GpuMemory(name="GH200", total_gib=94.88, multiprocessor_count=132, compute_capability="9.0",
                  source="torch's `a total capacity of 94.88 GiB` on a GH200 whose nvidia-smi shows 97,871 MiB "
                         "(the 96 GB HBM3 part), https://github.com/Lightning-AI/litgpt/issues/1892"),
        GpuMemory(name="RTX-PRO-6000-Blackwell", total_gib=94.97, multiprocessor_count=188, compute_capability="12.0",
                  source="ds4's CUDA backend `total=94.97 GiB` (a CUDA program's own free/total line, not torch's) "
                         "on a 96GB RTX Pro 6000 Blackwell, https://github.com/antirez/ds4/issues/431"),
        GpuMemory(name="L40S", total_gib=44.42, multiprocessor_count=142, compute_capability="8.9",
                  source="`total_gpu_memory (44.42GiB)`, https://github.com/vllm-project/vllm/issues/15815"),
        GpuMemory(name="L40", total_gib=44.40, multiprocessor_count=142, compute_capability="8.9",
                  source="torch's `a total capacity of 44.40 GiB` on a single L40, "
                         "https://github.com/QwenLM/Qwen3-VL/issues/2097"),
        GpuMemory(name="RTX-3090", total_gib=23.69, multiprocessor_count=82, compute_capability="8.6",
                  source="torch's `a total capacity of 23.69 GiB` beside nvidia-smi's RTX 3090 (driver 545), "
                         "https://github.com/vllm-project/vllm/issues/2140, as on another 3090 in "
                         "https://github.com/OpenBMB/MiniCPM-V/issues/612; drivers differ by a tenth: "
                         "`total_gpu_memory=23.58GiB` in https://github.com/vllm-project/vllm/issues/10517"),
        GpuMemory(name="A10-24GB", total_gib=22.18, multiprocessor_count=72, compute_capability="8.6",
                  source="`a total capacity of 22.18 GiB`, https://github.com/OpenBMB/MiniCPM-V/issues/640"),
        GpuMemory(name="A10G", total_gib=22.49, multiprocessor_count=80, compute_capability="8.6",
                  source="torch's `22.49 GiB total capacity` on an A10G (2022), "
                         "https://github.com/AUTOMATIC1111/stable-diffusion-webui/issues/1259; a 2023 nvidia-smi "
                         "on driver 470 shows 22,731 MiB (22.20 GiB), "
                         "https://github.com/huggingface/text-generation-inference/issues/563"),
        GpuMemory(name="RTX-4090", total_gib=23.64, multiprocessor_count=128, compute_capability="8.9",
                  source="torch's `a total capacity of 23.64 GiB`, https://github.com/ali-vilab/VGen/issues/104"),
        GpuMemory(name="RTX-4090-D", total_gib=23.55, multiprocessor_count=114, compute_capability="8.9",
                  source="vLLM's `total_gpu_memory (23.55GiB)` on an NVIDIA GeForce RTX 4090 D, the China-market "
                         "4090 of 114 multiprocessors, https://github.com/johnson7788/RLDecisionAgent/blob/"
                         "706f52dd3ba4a90b29f024afb7e1b09316ab5821/backend/MCP_Agents/logs/model_test.log"),
        GpuMemory(name="RTX-A6000", total_gib=47.54, multiprocessor_count=84, compute_capability="8.6",
                  source="`total_gpu_memory=47.54GiB` on an \"A6000 (48G)\", https://github.com/vllm-project/vllm/"
                         "issues/10360"),
        GpuMemory(name="RTX-5090", total_gib=31.36, multiprocessor_count=170, compute_capability="12.0",
                  source="torch's `a total capacity of 31.36 GiB`, "
                         "https://github.com/TrajectoryCrafter/TrajectoryCrafter/issues/20"),
        GpuMemory(name="T4", total_gib=14.58, multiprocessor_count=40, compute_capability="7.5",
                  source="torch's `a total capacty of 14.58 GiB` on a Tesla T4, "
                         "https://github.com/datawhalechina/self-llm/issues/162"),
        GpuMemory(name="V100-32GB", total_gib=31.74, multiprocessor_count=80, compute_capability="7.0",
                  source="torch's `31.74 GiB total capacity` on a V100 32GB, "
                         "https://github.com/liucongg/ChatGLM-Finetuning/issues/73"),
        GpuMemory(name="A100-80GB", total_gib=79.25, multiprocessor_count=108, compute_capability="8.0",
                  source="vLLM's `Free memory on device (78.84/79.25 GiB)` on an A100-SXM4-80GB, "
                         "https://github.com/LukeJYK/AutoScientists/blob/39724139ee326cd2f2c47215958fbdc22764ba49"
                         "/vllm.log; torch prints the same 79.25 GiB on an A100 in "
                         "https://github.com/HiDream-ai/VAREdit/issues/6 and 79.14 GiB on another 80GB A100 in "
                         "https://github.com/lianqi1008/Control-GIC/issues/6"),
        GpuMemory(name="A100-40GB", total_gib=39.38, multiprocessor_count=108, compute_capability="8.0",
                  source="vLLM's `total_gpu_memory (39.38GiB)` on four A100s, "
                         "https://github.com/vllm-project/vllm/issues/16570; deviceQuery gives an A100-SXM4-40GB "
                         "42,298,834,944 bytes (39.39 GiB), https://github.com/bottlerocket-os/bottlerocket/pull/3873, "
                         "and torch 39.50 GiB on another A100, https://github.com/TianheWu/CoSeR/issues/10"),
        GpuMemory(name="L4", total_gib=22.03, multiprocessor_count=58, compute_capability="8.9",
                  source="torch's `a total capacity of 22.03 GiB` on an L4, "
                         "https://github.com/ArcInstitute/evo2/issues/190"),
        GpuMemory(name="MI300X", total_gib=191.98,
                  source="torch's `a total capacity of 191.98 GiB` (HIP) on eight MI300X, "
                         "https://github.com/vllm-project/vllm/issues/7951"),
        GpuMemory(name="GB10", total_gib=121.69, multiprocessor_count=48, compute_capability="12.1",
                  source="vLLM's `Free memory on device (110.37/121.69 GiB)` on a DGX Spark (GB10), "
                         "https://github.com/MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks/issues/47"),
        GpuMemory(name="H200", total_gib=139.81, multiprocessor_count=132, compute_capability="9.0",
                  source="vLLM's `Free memory on device (139.21/139.81 GiB) on startup` on a GPU whose MoE config "
                         "vLLM loads as `device_name=NVIDIA_H200`, https://github.com/sungwon-chae/arxiv_confi/blob/"
                         "bd1defe41b7e441c8f90d3ef6f3bd2636cad3f6a/tmp_memo.md; torch prints 139.80 GiB on 8xH200 in "
                         "https://github.com/Jackmin801/prime-rl-hardfork/blob/4efbae458d8cd2094b7fc1ba61155462f2cb6b3c"
                         "/benchmarks/results/BENCHMARKS.md, and nvidia-smi shows 143,771 MiB"),
        GpuMemory(name="B200", total_gib=178.36, multiprocessor_count=148, compute_capability="10.0",
                  source="torch's `a total capacity of 178.36 GiB` on 8xB200, https://github.com/PrimeIntellect-ai/"
                         "prime-rl/blob/d8f290ef0358a804f1912bd29ea1b37cc56894b4/benchmarks/results/BENCHMARKS.md; a "
                         "CUDA device query prints 178.35, https://github.com/pytorch/ao/pull/4002"),
        GpuMemory(name="H100-NVL", total_gib=93.00, multiprocessor_count=132, compute_capability="9.0",
                  source="torch's `a total capacity of 93.00 GiB` on an H100 NVL 94GB, "
                         "https://github.com/ali-vilab/VACE/issues/56"),
        GpuMemory(name="H20", total_gib=95.00, multiprocessor_count=78, compute_capability="9.0",
                  source="torch's `a total capacity of 95.00 GiB` on an H20 96G, "
                         "https://github.com/modelscope/DiffSynth-Studio/issues/1238"),
        GpuMemory(name="A800-80GB", total_gib=79.33, multiprocessor_count=108, compute_capability="8.0",
                  source="torch's `a total capacty of 79.33 GiB` on an A800-80G, "
                         "https://github.com/hahnyuan/PB-LLM/issues/3"),
        GpuMemory(name="A30", total_gib=23.53, multiprocessor_count=56, compute_capability="8.0",
                  source="torch's `a total capacty of 23.53 GiB` on an A30, https://github.com/google/RB-Modulation/issues/5"),
        GpuMemory(name="L20", total_gib=44.53, multiprocessor_count=92, compute_capability="8.9",
                  source="torch's `a total capacity of 44.53 GiB` on an NVIDIA L20 (48GB), "
                         "https://github.com/bytedance/HLLM/issues/3, and on eight L20s, "
                         "https://github.com/Tencent-Hunyuan/HunyuanCustom/issues/36"),
        GpuMemory(name="RTX-A5000", total_gib=23.67, multiprocessor_count=64, compute_capability="8.6",
                  source="torch's `23.67 GiB total capacity` on a 24G A5000, "
                         "https://github.com/Magicboomliu/Accelerator-Simple-Template/issues/7"),
        GpuMemory(name="RTX-A4000", total_gib=15.61, multiprocessor_count=48, compute_capability="8.6",
                  source="torch's `GPU 0 has a total capacity of 15.61 GiB` on an RTX A4000 (2025), "
                         "https://github.com/DengKaiCQ/VGGT-Long/issues/6; an older driver printed 15.73, "
                         "https://github.com/Zeqiang-Lai/Mini-DALLE3/issues/9"),
        GpuMemory(name="V100-16GB", total_gib=15.78, multiprocessor_count=80, compute_capability="7.0",
                  source="torch's `15.78 GiB total capacity` on a 16G V100, "
                         "https://github.com/kchengiva/Shift-GCN/issues/34 (15.75 on other boards, "
                         "https://github.com/XuyangBai/TransFusion/issues/49)"),
        GpuMemory(name="RTX-3060-12GB", total_gib=11.76, multiprocessor_count=28, compute_capability="8.6",
                  source="torch's `11.76 GiB total capacity` on an RTX 3060 12gb, "
                         "https://github.com/TencentARC/PhotoMaker/issues/47"),
        GpuMemory(name="RTX-2080-Ti", total_gib=10.76, multiprocessor_count=68, compute_capability="7.5",
                  source="torch's `10.76 GiB total capacity` on a 2080 Ti, "
                         "https://github.com/JDAI-CV/image-captioning/issues/11 and "
                         "https://github.com/princeton-vl/pytorch_stacked_hourglass/issues/18"),
    )
}


def known_gpu(name: str | None, total_bytes: int | None = None) -> GpuMemory | None:
    """The catalogue entry of the GPU a start runs on: by its name, else by its total where one entry alone prints
    that total (a log that states only `total_gpu_memory=44.42GiB` ran on an L40S); None where neither tells."""
    if name:
        try:
            return gpu_memory(name)
        except HarnessError:
            pass
    if total_bytes is None:
        return None
    printed = round(total_bytes / GiB, 2)
    matches = [gpu for gpu in GPUS.values() if gpu.total_gib == printed]
    return matches[0] if len(matches) == 1 else None


# Systems sold under their own name, by the GPU they hold (spelt as `_spelling` leaves them).
SYSTEM_GPUS = {"dgxspark": "gb10"}


def gpu_memory(name: str) -> GpuMemory:
    """The catalogue entry for a GPU name, matched without regard to case, spaces, hyphens or underscores
    ("rtx 4090" is RTX-4090), as CUDA names the device ("NVIDIA A100-SXM4-40GB" is A100-40GB), or for a system
    named by its GPU ("DGX Spark" is GB10); a name that only begins one or more entries ("H100") is refused with
    them."""
    spelt = _spelling(name)
    spellings = (SYSTEM_GPUS.get(spelt, spelt), _device_spelling(name))
    for spelling in spellings:
        for known, gpu in GPUS.items():
            if _spelling(known) == spelling:
                return gpu
    meant = [known for known in GPUS if any(asked and _spelling(known).startswith(asked) for asked in spellings)]
    hint = f"did you mean {' or '.join(meant)}?" if meant else f"known: {', '.join(GPUS)}"
    raise HarnessError(
        f"GPU '{name}' has no sourced memory figure here ({hint}); or give its total in GiB as vLLM logs it, "
        "e.g. --gpu 79.19"
    )


# Data-centre parts of Hopper and later sold on NVSwitch boards (HGX, DGX, NVL72), spelt as `_spelling` leaves
# them; the PCIe cards and NVL pairs of the same chips (`H100 PCIe`, `H100 NVL`, the 94 GiB `H100-96GB`,
# `H200 NVL`) bridge two GPUs at most, and a GH200 stands alone.
NVSWITCH_CHIPS = ("h100", "h200", "h800", "h20", "b200", "b300")
NVSWITCH_EXCEPTIONS = ("pcie", "nvl", "96gb", "gh200")
HOPPER_CHIPS = ("h100", "h200", "h800", "h20")  # compute capability 9.0, GH200's GPU included
BLACKWELL_DATACENTRE_CHIPS = ("b100", "b200", "b300")  # compute capability 10.x, GB200's and GB300's included
HOST_MEMORY_CHIPS = ("gb10", "dgxspark")  # integrated: the GPU's memory is the host's


def is_hopper(name: str | None) -> bool:
    """Whether a GPU of this name (the catalogue's, or nvidia-smi's) is a Hopper part (sm90)."""
    spelt = _spelling(name or "")
    return any(chip in spelt for chip in HOPPER_CHIPS)


def is_blackwell_datacentre(name: str | None) -> bool:
    """Whether a GPU of this name is a data-centre Blackwell part (sm100), not an RTX card or GB10 (sm120/121)."""
    spelt = _spelling(name or "")
    return any(chip in spelt for chip in BLACKWELL_DATACENTRE_CHIPS)


def shares_host_memory(name: str | None) -> bool:
    """Whether a GPU of this name is integrated with its host (a GB10), so that CUDA's free memory is the
    system's and whatever the host allocates meanwhile shows in vLLM's non-torch figure."""
    spelt = _spelling(name or "")
    return any(chip in spelt for chip in HOST_MEMORY_CHIPS)


def on_nvswitch(name: str | None) -> bool:
    """Whether a GPU of this name (the catalogue's, or nvidia-smi's) sits on an NVSwitch with its peers; an H100
    named without its form factor is taken as the SXM part, the one multi-GPU servers hold."""
    spelt = _spelling(name or "")
    return any(chip in spelt for chip in NVSWITCH_CHIPS) and not any(part in spelt for part in NVSWITCH_EXCEPTIONS)


def _spelling(name: str) -> str:
    return "".join(character for character in name.lower() if character.isalnum())


# Words CUDA's device names (torch's, nvidia-smi's) carry beside what the catalogue names: the vendor and brand,
# and a form factor or memory type the card's total does not depend on.
DEVICE_NAME_EXTRAS = frozenset({"nvidia", "tesla", "geforce", "sxm", "sxm2", "sxm4", "sxm5", "pcie", "hbm2", "hbm2e",
                                "hbm3", "hbm3e", "workstation", "server", "edition"})


def _device_spelling(name: str) -> str:
    """A device name as CUDA prints it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4") spelt as the
    catalogue's ("h10080gb", "a10040gb", "t4")."""
    return "".join(word for word in re.split(r"[^a-z0-9]+", name.lower()) if word not in DEVICE_NAME_EXTRAS)
