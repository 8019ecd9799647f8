"""Memory outside torch's allocator that vLLM subtracts before the cache, by release and parallel layout.

vLLM's profile counts as non-torch memory what the device gained outside torch's allocator since
the worker's first snapshot (`memory_profiling`, `diff_from_create.non_torch_memory`: V0 worker.py
from 0.6.5, V1 gpu_worker.py from 0.9.1; before those, everything outside torch, the CUDA context
included). Whether the communicators' buffers fall inside that window depends on where the
snapshot sits against `init_worker_distributed_environment`, which creates the NCCL communicator
(pynccl.py `PyNcclCommunicator.__init__` runs a one-element warm-up all-reduce, so its ring is
connected and its buffers allocated there) and the custom all-reduce:

- V0 (0.6.3 `init_gpu_memory`, 0.7.3-0.10 `baseline_snapshot`) and V1 0.8.5-0.10.x (`init_gpu_memory`,
  then `init_snapshot`) take the snapshot before that call: the buffers are counted;
- V1 from 0.11.0 initialises the distributed environment first ("Initialize the distributed
  environment BEFORE taking memory snapshot", gpu_worker.py `init_device`, read in 0.11.0 … 0.33.0),
  and requests total × utilisation from that snapshot: the buffers are neither counted nor subtracted.

What is counted then: the custom all-reduce's two IPC buffers, allocated with cudaMalloc outside
torch (custom_all_reduce.py `CustomAllreduce.__init__`: `meta_size() + max_size` and `max_size`, with
max_size = 8,192 × 1,024 B; its 8 MiB `rank_data` is a torch tensor), for world sizes 2, 4, 6 and 8;
and NCCL's own buffers, which NCCL sizes (channels × peers × protocol buffers) and vLLM's code does
not state: fitted per GPU (`MemoryConstants.nccl_gib`).

On an NVSwitch board of Hopper or later NCCL adds NVLink SHARP (NVLS) buffers once a communicator spans more
than two GPUs (vllm#9699, measured on H100 and H200). NCCL prints their size: "NVLS comm … nHeads 8 buffSize
4194304 memSize 2097152 nvlsPerRankSize 301989888 nvlsTotalSize 2415919104" on eight H200s, that is 24 channels
× 2 × (4 MiB + 2 MiB) = 288 MiB per rank, times the ranks, on every GPU. NCCL connects them at the first
collective that runs NVLS (its connections are made at run time from NCCL 2.22 on), the profile's large
all-reduce, so every release's profile holds them, wherever its snapshot sits.

Where a release counts the CUDA context, part of it scales with the GPU: the driver reserves local memory (each
thread's stack) for every thread the GPU can hold at once, per-thread size × resident threads per multiprocessor
× multiprocessors, sized at creation from the default stack limit (cudaLimitStackSize, 1,024 B), as NVIDIA's
forum answer "Memory required for kernel launch" gives the formula
(https://forums.developer.nvidia.com/t/memory-required-for-kernel-launch/39558). On an H200 that is
132 × 2,048 × 1 KiB = 264 MiB of the 526.8 MiB its context took at creation (benchmarks/gpu_memory_terms.py,
torch 2.11 and CUDA 13.0). The other 262.8 MiB, the driver's own, is taken as measured for every GPU and
release (`CUDA_CONTEXT_REST_BYTES`); the fit half holds a single start that states a counted context (its
remainder, 0.34 GiB, leans on the fitted NCCL figure as well), too little to fit it on. What lazily loaded
kernels add after creation is in the fitted base, which every release counts.
"""

from __future__ import annotations

from typing import Literal

from packaging.version import Version

from harness.predict.gpu_catalog import GPUS, GpuMemory, is_hopper, on_nvswitch, shares_host_memory
from harness.units import GiB

V1_COMMUNICATORS_BEFORE_SNAPSHOT_SINCE = Version("0.11.0")
# Before 0.9 (torch 2.5-2.6, NCCL 2.21.5) tensor-parallel starts log far more outside torch than later ones, and
# far more on some machines than others: 0.29-0.43 GiB a rank on L40S starts, a 47.50 GiB card's and an
# A100-40GB's (vllm#15815, #12663, #16570, gnosia93/vlm-on-eks), 1.39-1.54 GiB on an A800's and a 39.50 GiB
# card's (QMMMS/QMMMS.github.io, daxdelvira/distributed_agent_gc), 0.89-2.24 GiB across the ranks of two 0.8.3
# starts at TP 4 and PP 2 on A100-SXM4-40GB nodes (surajssd/llm-k8s, Llama-3.3-70B-Instruct's lws-run-1.sh and
# lws-run-2.sh), against 0.11-0.21 GiB from 0.9 on. What sets the difference (NCCL's channels over NVLink or PCIe,
# the communicators connected at init) is not in vLLM's code, and the fit half holds one such start: the figure is
# not fitted apart, and the waterfall says how far it may be off.
EARLY_NCCL_BEFORE = Version("0.9")
EARLY_NCCL_NOTE = ("; before 0.9 public tensor-parallel logs state 0.29 to 0.43 GiB a rank outside torch on L40S, "
                   "A100-40GB and 48 GB cards and 0.89 to 2.24 GiB on an A800 and other A100-40GB nodes: this "
                   "figure may be low by up to 2.1 GiB")
CUSTOM_ALL_REDUCE_MAX_BYTES = 8192 * 1024
CUSTOM_ALL_REDUCE_WORLD_SIZES = frozenset({2, 4, 6, 8})
CUSTOM_ALL_REDUCE_BYTES = 2 * CUSTOM_ALL_REDUCE_MAX_BYTES  # meta (a few KiB, left out) + max_size, and max_size
NVLS_BYTES_PER_RANK = 24 * 2 * (4 * 1024 * 1024 + 2 * 1024 * 1024)  # nvlsPerRankSize 301989888
NVLS_MIN_RANKS = 3
CUDA_STACK_BYTES_PER_THREAD = 1024  # cudaLimitStackSize's default
CUDA_CONTEXT_REST_BYTES = int(262.8 * 1024 * 1024)  # an H200's 526.8 MiB context less its 264 MiB of local memory
# A GPU the catalogue cannot name is priced at the most threads any entry holds (a B200's 148 × 2,048): the
# larger context, the safer side of a fit / no-fit call.
MOST_RESIDENT_THREADS = max(gpu.resident_threads or 0 for gpu in GPUS.values())


BaseClass = Literal["host memory", "hopper", "other"]


def base_class(gpu_name: str | None) -> BaseClass:
    """Which fitted non-torch base a GPU takes: its own on a GPU sharing its host's memory (a GB10), whose figure
    also holds what the host allocated during the profile, and on a Hopper part; the common one elsewhere."""
    if shares_host_memory(gpu_name):
        return "host memory"
    return "hopper" if is_hopper(gpu_name) else "other"


def communicators_counted(version: Version, v0: bool, tensor_parallel_size: int, pipeline_parallel_size: int) -> bool:
    """Whether the profile's non-torch figure holds the NCCL and custom all-reduce buffers."""
    parallel = tensor_parallel_size * pipeline_parallel_size > 1
    return parallel and (v0 or version < V1_COMMUNICATORS_BEFORE_SNAPSHOT_SINCE)


def communicator_bytes(nccl_gib: float, tensor_parallel_size: int) -> int:
    """NCCL's fitted buffers plus the custom all-reduce's two IPC buffers where its world size allows one."""
    custom = CUSTOM_ALL_REDUCE_BYTES if tensor_parallel_size in CUSTOM_ALL_REDUCE_WORLD_SIZES else 0
    return int(nccl_gib * GiB) + custom


def nvls_bytes(gpu_name: str | None, tensor_parallel_size: int) -> int:
    """NCCL's NVLS buffers on each GPU: 288 MiB per rank of the tensor-parallel group, on NVSwitch parts past two."""
    if tensor_parallel_size < NVLS_MIN_RANKS or not on_nvswitch(gpu_name):
        return 0
    return NVLS_BYTES_PER_RANK * tensor_parallel_size


def context_local_memory_bytes(gpu: GpuMemory | None) -> int:
    """The CUDA context's local-memory reservation on this GPU: the default stack for every resident thread."""
    threads = gpu.resident_threads if gpu is not None else None
    return CUDA_STACK_BYTES_PER_THREAD * (threads or MOST_RESIDENT_THREADS)


def context_bytes(gpu: GpuMemory | None) -> int:
    """The whole CUDA context on this GPU: its local memory, and the measured rest."""
    return context_local_memory_bytes(gpu) + CUDA_CONTEXT_REST_BYTES
