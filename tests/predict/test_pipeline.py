"""Pipeline stages: vLLM's layer split, each stage's memory from its ranks, the fewest blocks set the cache."""

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.predict.budget import predict_capacity
from harness.predict.model_shape import load_model_shape
from harness.predict.pipeline import pipeline_stages, predict_pipeline_capacity, stage_memory

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"


def test_pipeline_stages_split_layers_like_vllm() -> None:
    # DeepSeek-V2-Lite: 27 layers over 2 stages → 13 each and 1 left, which goes to the stage before the last:
    # 14 + 13; over 4 stages → 6 each and 3 left, one for each of the three stages before the last: 7, 7, 7, 6
    shape = load_model_shape(str(CONFIGS / "deepseek-ai--DeepSeek-V2-Lite.json"))
    assert [len(stage.layers) for stage in pipeline_stages(shape, 2)] == [14, 13]
    assert [len(stage.layers) for stage in pipeline_stages(shape, 4)] == [7, 7, 7, 6]


def test_more_stages_than_layers_is_refused() -> None:
    shape = load_model_shape(str(CONFIGS / "deepseek-ai--DeepSeek-V2-Lite.json"))
    with pytest.raises(HarnessError, match="between 1 and the model's 27 layers, got 28"):
        pipeline_stages(shape, 28)


def test_each_stage_takes_the_smallest_of_its_ranks() -> None:
    # TP 2 × PP 2: ranks 0, 1 are stage 0 and ranks 2, 3 stage 1
    by_rank = {0: 130, 1: 120, 2: 100, 3: 110}
    assert stage_memory(by_rank, 100, tensor_parallel_size=2, pipeline_parallel_size=2) == [120, 100]
    # three of four ranks printed: the one headline figure stands for every stage
    assert stage_memory({0: 130, 1: 120, 2: 100}, 100, tensor_parallel_size=2, pipeline_parallel_size=2) == [100, 100]


def test_the_stage_with_fewest_blocks_sets_the_cache() -> None:
    # 14 and 13 layers with the same memory: the 14-layer stage has 13/14 of the other's blocks, so it decides
    shape = load_model_shape(str(CONFIGS / "deepseek-ai--DeepSeek-V2-Lite.json"))
    first, second = pipeline_stages(shape, 2)
    arguments = {"block_size": 16, "max_model_len": 1024}
    whole = predict_pipeline_capacity(shape, [10 * 2**30, 10 * 2**30], **arguments)
    assert whole == predict_capacity(first, available_kv_bytes=10 * 2**30, **arguments)
    assert whole.num_blocks < predict_capacity(second, available_kv_bytes=10 * 2**30, **arguments).num_blocks
    assert predict_pipeline_capacity(shape, [10 * 2**30], **arguments) == predict_capacity(
        shape, available_kv_bytes=10 * 2**30, **arguments)
