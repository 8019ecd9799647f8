"""What PyTorch's CUDA caching allocator counts as allocated for one weight tensor: its bytes, and for a large one
the slack of the block it is handed.

A request of 10 MiB or more that no cached block serves gets a segment of its own, rounded up to 2 MiB
(`kMinLargeAlloc`, `kRoundLarge`, `get_allocation_size`), and the allocator splits the rest off into a free block
only when more than 1 MiB would be left (`should_split`: `remaining > kSmallSize` in the large pool); otherwise the
tensor's block is the whole segment, and `memory_allocated` counts it. Smaller requests are packed into shared
2 MiB or 20 MiB segments, split to 512 B. (c10/cuda/CUDACachingAllocator.cpp, the same constants in every torch
release vLLM has pinned; `expandable_segments:True`, which vLLM does not set, splits every block instead.)

vLLM creates each weight on the GPU as its model is built and reports "Model loading took" from
`torch.cuda.max_memory_allocated` (DeviceMemoryProfiler), so that slack is in the logged weights: a Qwen2-7B
layer's fused QKV (31.5 MiB), o_proj (24.5 MiB), gate_up (259 MiB) and down (129.5 MiB) projections keep
0.5 + 0 + 1 + 0.5 = 2 MiB, and with the embedding's and the output layer's 0.5 MiB each that is 57 MiB over 28
layers, where its logs load 57.8 MiB beyond its parameters.
"""

from __future__ import annotations

from harness.units import round_up

MiB = 1 << 20
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to it
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # kMinLargeAlloc: from here a request gets a segment of its own
ROUND_LARGE_BYTES = 2 * MiB  # kRoundLarge
SMALL_SIZE_BYTES = 1 * MiB  # kSmallSize: a large block is split only when more than this is left


def block_slack_bytes(nbytes: int) -> int:
    """The bytes beyond `nbytes` the allocator counts for a tensor placed in a fresh segment."""
    requested = round_up(nbytes, MIN_BLOCK_BYTES)
    if requested < MIN_LARGE_ALLOC_BYTES:
        return requested - nbytes
    left = -requested % ROUND_LARGE_BYTES
    return requested - nbytes + (left if left <= SMALL_SIZE_BYTES else 0)
