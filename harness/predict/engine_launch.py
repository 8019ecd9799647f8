"""The vLLM launch a before-launch waterfall prices: the engine's flags as one object.

`harness budget --gpu`'s options, a start-up log (`harness capacity`, the drift check) and a field-corpus case
each build one `EngineLaunch`, and the waterfall reads only it: a flag the calculator learns is added here and
where it is read, not at every layer in between.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.speculative import SpeculativeDecoding


class EngineLaunch(BaseModel):
    """The engine flags the memory terms depend on, as vLLM takes them (None: the release's default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine_version: str
    engine_generation: str | None = None  # "V0" or "V1" where the launch chose it (VLLM_USE_V1)
    max_model_len: int
    gpu_memory_utilization: float | None = None  # None: the release's default (releases.py)
    dtype_bytes: int = 2
    quantization: str | None = None  # --quantization; None reads the checkpoint's own quantization_config
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    sampler: str | None = None  # V1's top-k/top-p implementation as installed: "flashinfer" or "pytorch"
    speculative: SpeculativeDecoding | None = None
    encoder: EncoderLaunch = EncoderLaunch()  # a VL model's encoder profile: skipped, and the limits per prompt
    enforce_eager: bool = False  # --enforce-eager: no CUDA graphs
    graph_memory_profiled: bool = True  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (0.21+) turns it off
