"""Pipeline parallelism: each stage holds its own layers' cache in its own memory, and the engine runs
with the fewest blocks any stage has, so one stage's shortfall is the whole engine's capacity.

A speculative drafter runs on the last stage alone: vLLM's GPU model runner builds it only
`if self.speculative_config and get_pp_group().is_last_rank` ("currently we put the entire draft model
on the last PP rank", vllm/v1/worker/gpu_model_runner.py at 000fc94b), so its layers, and their cache,
are that stage's; the speculative tokens still widen every stage's state layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.errors import HarnessError
from harness.predict.architectures import language_config
from harness.predict.budget import CapacityPrediction, predict_capacity
from harness.predict.kv_bytes import check_attention_heads
from harness.predict.model_shape import ModelShape


def layer_shares(count: int, pipeline_parallel_size: int) -> list[int]:
    """vLLM's layer split (`get_pp_indices`): equal shares, the remainder going to the stages before the last."""
    if not 1 <= pipeline_parallel_size <= count:
        raise HarnessError(f"pipeline_parallel_size must be between 1 and the model's {count} layers, "
                           f"got {pipeline_parallel_size}")
    shares = [count // pipeline_parallel_size] * pipeline_parallel_size
    for i in range(2, count % pipeline_parallel_size + 2):
        shares[-i] += 1
    return shares


def pipeline_stages(shape: ModelShape, pipeline_parallel_size: int) -> list[ModelShape]:
    """One shape per stage, holding that stage's share of the layers. Layers that reuse an earlier layer's cache
    are left out of `shape.layers`, so the split over all the model's layers is not known: refused past one stage."""
    if pipeline_parallel_size > 1 and language_config(shape.config).get("num_kv_shared_layers"):
        raise HarnessError(f"{shape.name}: pipeline parallelism over layers that share another layer's KV cache "
                           "(num_kv_shared_layers) is not modelled")
    stages, start = [], 0
    for share in layer_shares(len(shape.layers), pipeline_parallel_size):
        stages.append(shape.model_copy(update={"layers": shape.layers[start:start + share]}))
        start += share
    return stages


def stage_memory(by_rank: dict[int, int], headline: int | None, *, tensor_parallel_size: int,
                 pipeline_parallel_size: int) -> list[int] | None:
    """Each stage's KV memory: the smallest of its ranks' (ranks counted stage by stage), or, when the log
    does not give exactly ranks 0 … PP×TP−1 a figure each (a rank missing, or one of another layout), its one
    figure for every stage."""
    if set(by_rank) == set(range(pipeline_parallel_size * tensor_parallel_size)):
        return [min(by_rank[stage * tensor_parallel_size + rank] for rank in range(tensor_parallel_size))
                for stage in range(pipeline_parallel_size)]
    return None if headline is None else [headline] * pipeline_parallel_size


def predict_pipeline_capacity(shape: ModelShape, stage_kv_bytes: Sequence[int], **capacity: Any) -> CapacityPrediction:
    """The release's arithmetic on each stage's memory and layers; the stage with fewest blocks sets the cache.
    `capacity` takes `predict_capacity`'s keyword arguments; one stage is the whole model."""
    check_attention_heads(shape.config, capacity.get("tensor_parallel_size", 1))
    stages = pipeline_stages(shape, len(stage_kv_bytes))
    predictions = [predict_capacity(stage, available_kv_bytes=max(0, available), holds_drafter=stage is stages[-1],
                                    **capacity)
                   for stage, available in zip(stages, stage_kv_bytes, strict=True)]
    return min(predictions, key=lambda prediction: prediction.num_blocks)
