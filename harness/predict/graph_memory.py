"""CUDA-graph memory in the waterfall: reserved before the cache where the release estimates it, else captured out
of what the cache leaves.

From 0.21 vLLM profiles its CUDA graphs and reserves the estimate before sizing the cache ("CUDA graph memory
profiling is enabled (default since v0.21.0)", gpu_worker.py), unless VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0;
the second model runner estimates none before 0.29 (model_runner.py). The figure itself is fitted.
"""

from __future__ import annotations

from packaging.version import Version

from harness.predict.engine_launch import EngineLaunch
from harness.predict.model_runner import GRAPHS_ESTIMATED_SINCE, reserves_graph_estimate
from harness.predict.releases import GRAPHS_RESERVED_SINCE
from harness.predict.term import Term
from harness.units import GiB


def graphs_term(cuda_graph_gib: float, version: Version, launch: EngineLaunch, on_second_runner: bool) -> Term:
    """The fitted graph memory, and whether this launch's release reserves it before the cache."""
    if launch.enforce_eager:
        return Term(name="cuda_graphs", bytes=0, subtracted=False,
                    source="none: --enforce-eager captures no CUDA graphs")
    graph_bytes = int(cuda_graph_gib * GiB)
    reserved = (version >= GRAPHS_RESERVED_SINCE and launch.graph_memory_profiled
                and reserves_graph_estimate(version, on_second_runner))
    if reserved:
        how = "reserved before the cache from 0.21 on"
    elif version < GRAPHS_RESERVED_SINCE:
        how = f"captured after the cache is sized in {version}: not subtracted"
    elif not launch.graph_memory_profiled:
        how = "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0: captured after the cache, not subtracted"
    else:
        how = (f"the second runner estimates none before {GRAPHS_ESTIMATED_SINCE}: captured after the cache, "
               "not subtracted")
    # the source shows this figure, rounded as the table rounds it
    return Term(name="cuda_graphs", bytes=graph_bytes, subtracted=reserved,
                source=f"fitted {graph_bytes / GiB:.2f} GiB; {how}")
