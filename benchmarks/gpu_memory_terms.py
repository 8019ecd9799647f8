"""The calculator's GPU-side figures, measured on the GPU this runs on (needs torch with CUDA, and nvidia-smi).

Printed, each beside the figure the calculator uses:
- the GPU total as nvidia-smi gives it (`memory.total`, `memory.reserved`) and as CUDA gives it
  (`torch.cuda.mem_get_info`): device.json records total − reserved, which must equal CUDA's within a MiB;
- the CUDA context (device memory in use before torch allocates anything), then what each library adds
  outside torch's allocator when first used: cuBLAS, scaled-dot-product attention, a CUDA graph, and a
  one-rank NCCL process group once a collective has run on it;
- the sampler's peak per logit over (rows × vocabulary) model-dtype logits: the PyTorch sort path as V1's
  `Sampler.forward` and `apply_top_k_top_p_pytorch` run it (topk_topp_sampler.py, read in 0.32; V0's
  `_apply_top_k_top_p` holds the same tensors at the sort), and the native path after Triton's in-place
  mask. Peaks are torch's `max_memory_allocated` over the call, the logits included.

    python benchmarks/gpu_memory_terms.py [--rows 64 256 1024] [--vocab 32000 151936 262144]
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed

from harness.predict.memory_model import FITTED_CONSTANTS
from harness.predict.non_torch import CUDA_CONTEXT_REST_BYTES, CUDA_STACK_BYTES_PER_THREAD
from harness.predict.sampler_peak import TRITON_BYTES_PER_LOGIT

MiB = 1024 * 1024


def nvidia_smi_mib(field: str) -> int:
    listed = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                            capture_output=True, text=True, check=True).stdout
    return int(listed.splitlines()[0])


def outside_torch_mib() -> float:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / MiB


def report_totals_and_context() -> None:
    smi_total, smi_reserved = nvidia_smi_mib("memory.total"), nvidia_smi_mib("memory.reserved")
    free, total = torch.cuda.mem_get_info()  # creates the context
    print(f"nvidia-smi memory.total {smi_total} MiB, memory.reserved {smi_reserved} MiB: device.json total "
          f"{smi_total - smi_reserved} MiB; CUDA's total {total / MiB:.2f} MiB ({total} bytes)")
    device = torch.cuda.get_device_properties(0)
    threads = device.multi_processor_count * device.max_threads_per_multi_processor
    local_mib = threads * CUDA_STACK_BYTES_PER_THREAD / MiB
    print(f"CUDA context: {(total - free) / MiB:.1f} MiB before any allocation (calculator, where a release counts "
          f"it: {CUDA_CONTEXT_REST_BYTES / MiB:.1f} MiB as measured on an H200 + {local_mib:.0f} MiB of local "
          f"memory for {threads:,} resident threads)")


def report_libraries() -> None:
    """Each library's first use, as memory outside torch's allocator gained since the one before."""
    steps: list[tuple[str, Callable[[], object]]] = [
        ("first tensor", lambda: torch.zeros(1, device="cuda")),
        ("cuBLAS bf16 matmul", matmul),
        ("scaled-dot-product attention", attention),
        ("CUDA graph of a matmul", capture_graph),
        ("NCCL, one rank, one all-reduce", one_rank_all_reduce),
    ]
    before = outside_torch_mib()
    for name, step in steps:
        step()
        now = outside_torch_mib()
        print(f"  outside torch after {name}: {now:.1f} MiB (+{now - before:.1f})")
        before = now


def matmul() -> object:
    square = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return square @ square


def attention() -> object:
    heads = torch.randn(4, 32, 2048, 128, device="cuda", dtype=torch.bfloat16)
    return torch.nn.functional.scaled_dot_product_attention(heads, heads, heads, is_causal=True)


def capture_graph() -> object:
    static = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static @ weight  # warm-up off the capturing stream, as torch's graph recipe asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static @ weight
    graph.replay()
    return graph


def one_rank_all_reduce() -> object:
    torch.distributed.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    tensor = torch.ones(1024, device="cuda")
    torch.distributed.all_reduce(tensor)  # the group stays up, its buffers held, until the process ends
    return tensor


def sort_path(logits: Any) -> Any:
    """V1 Sampler.forward's fp32 copy and in-place temperature, then apply_top_k_top_p_pytorch with
    top-k = vocabulary − 1 and top-p 0.99 (the warm-up's), then forward_native's softmax and random_sample."""
    rows, vocab = logits.shape
    k = torch.full((rows,), vocab - 1, device="cuda", dtype=torch.int32)
    p = torch.full((rows,), 0.99, device="cuda")
    scores = logits.to(torch.float32)
    scores.div_(torch.full((rows, 1), 0.5, device="cuda"))
    scores_sort, scores_idx = scores.sort(dim=-1, descending=False)
    threshold = scores_sort.gather(1, (scores_sort.size(1) - k.to(torch.long)).unsqueeze(dim=1))
    scores_sort.masked_fill_(scores_sort < threshold, -float("inf"))
    probs_sum = torch.cumsum(scores_sort.softmax(dim=-1), dim=-1)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    top_p_mask[:, -1] = False
    scores_sort.masked_fill_(top_p_mask, -float("inf"))
    scores.scatter_(dim=-1, index=scores_idx, src=scores_sort)
    del scores_sort, scores_idx, probs_sum, top_p_mask
    return after_mask(scores)


def triton_path(logits: Any) -> Any:
    """The fp32 copy, masked in place by Triton (no tensor of its own), then the native path."""
    return after_mask(logits.to(torch.float32))


def after_mask(scores: Any) -> Any:
    probs = scores.softmax(dim=-1, dtype=torch.float32)
    draws = torch.empty_like(probs)
    draws.exponential_()
    return probs.div_(draws).argmax(dim=-1)


def peak_bytes_per_logit(path: Callable[[Any], Any], rows: int, vocab: int) -> float:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
    path(logits)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / (rows * vocab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256, 1024])  # below 128, the flattened sort
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936, 262144])
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    report_totals_and_context()
    report_libraries()
    print(f"sampler peak, bytes per logit (calculator: sort {FITTED_CONSTANTS.sampler_bytes_per_logit} fitted, "
          f"Triton {TRITON_BYTES_PER_LOGIT} from the code):")
    for rows in args.rows:
        for vocab in args.vocab:
            sort, triton = (peak_bytes_per_logit(path, rows, vocab) for path in (sort_path, triton_path))
            print(f"  {rows} rows × {vocab} vocabulary: sort {sort:.2f}, Triton {triton:.2f}")


if __name__ == "__main__":
    main()
