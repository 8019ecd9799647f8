"""Pipeline stages: vLLM's layer split, each stage's memory from its ranks, the fewest blocks set the cache."""

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.predict.budget import predict_capacity
from harness.predict.budget_plan import BudgetOptions, plan_budget
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
    memory = 10 * 2**30
    whole = predict_pipeline_capacity(shape, [memory, memory], block_size=16, max_model_len=1024)
    assert whole == predict_capacity(first, available_kv_bytes=memory, block_size=16, max_model_len=1024)
    assert whole.num_blocks < predict_capacity(second, available_kv_bytes=memory, block_size=16,
                                               max_model_len=1024).num_blocks
    assert predict_pipeline_capacity(shape, [memory], block_size=16, max_model_len=1024) == predict_capacity(
        shape, available_kv_bytes=memory, block_size=16, max_model_len=1024)


def test_budget_prices_the_first_stage_on_each_gpu() -> None:
    # TP 2 × PP 2 over DeepSeek-V2-Lite's 27 layers: a GPU of the first stage holds 14 MLA layers at 1,152 B per
    # token (576 bf16 values, not split by TP): 1,024 tokens take 14 × 1,152 × 1,024 = 16,515,072 B. With 11.33 GiB
    # per GPU (12,165,494,865 B) the 14-layer stage has 12,165,494,865 // (14 × 16 × 1,152 = 258,048) = 47,144
    # blocks, fewer than the 13-layer stage's, so the engine holds 47,144 × 16 = 754,304 tokens.
    shape = load_model_shape(str(CONFIGS / "deepseek-ai--DeepSeek-V2-Lite.json"))
    options = BudgetOptions(tokens=1024, available_kv_gib=11.33, max_model_len=1024, tensor_parallel_size=2,
                            pipeline_parallel_size=2)
    result = plan_budget(shape, options)
    assert result.population_kv_bytes_raw == 16_515_072
    assert result.capacity is not None
    assert (result.capacity.num_blocks, result.capacity.kv_cache_tokens) == (47_144, 754_304)
