"""Pipeline stages: vLLM's layer split, each stage's memory from its ranks, the fewest blocks set the cache."""

import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.predict.budget import predict_capacity
from harness.predict.budget_plan import BudgetOptions, plan_budget
from harness.predict.memory_model import stage_kv_bytes
from harness.predict.model_shape import load_model_shape
from harness.predict.parameter_count import model_size
from harness.predict.pipeline import pipeline_stages, predict_pipeline_capacity, stage_memory
from harness.predict.speculative import SpeculativeDecoding
from harness.predict.weights import weights_term

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
    # four figures, but rank 3 is missing and a rank 5 is not of this layout: the headline again
    assert stage_memory({0: 130, 1: 120, 2: 100, 5: 90}, 100, tensor_parallel_size=2,
                        pipeline_parallel_size=2) == [100, 100]


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


def test_each_stage_holds_its_layers_and_ends_and_only_the_last_samples() -> None:
    # A 3-layer Llama: attention 1,024 × 128 × (16 + 16) = 4,194,304 and MLP 3 × 1,024 × 4,096 = 12,582,912 per
    # layer, 50,331,648 in all; untied embeddings 2 × 32,000 × 1,024 = 65,536,000. Over 2 stages at 2 B a weight
    # the even split is (50,331,648 + 65,536,000) × 2 / 2 = 115,867,648 B a GPU.
    size = model_size({"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 3,
                       "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096,
                       "vocab_size": 32000, "tie_word_embeddings": False})
    kv = 10 * 1024**3  # 10,737,418,240 B left by the even split, with the sampler's peak on every stage
    stages = stage_kv_bytes(size, kv, weights_bytes=115_867_648, sampler_excess_bytes=500_000_000, dtype_bytes=2,
                            tensor_parallel_size=1, pipeline_parallel_size=2)
    # Layers split 2 + 1, 100,663,296 B of them; each end holds one 32,000 × 1,024 × 2 = 65,536,000 B table.
    # Stage 0: 67,108,864 + 65,536,000 = 132,644,864 B, 16,777,216 more than the even split, and no sampler:
    # 10,737,418,240 − 16,777,216 + 500,000,000 = 11,220,641,024. Stage 1: 33,554,432 + 65,536,000 = 99,090,432 B,
    # 16,777,216 less, and it samples: 10,737,418,240 + 16,777,216 = 10,754,195,456.
    assert stages == [11_220_641_024, 10_754_195_456]
    assert stage_kv_bytes(size, kv, 115_867_648, 500_000_000, 2, 1, 1) == [kv]  # one stage: the whole GPU's figure


def test_a_vision_tower_takes_the_same_memory_from_every_stage() -> None:
    # Qwen2.5-VL-7B's tower is held whole on each of 3 stages (its 28 layers split 10 + 9 + 9): each stage's KV
    # memory is the text model's less the tower's bytes; split with the layers, the first stage would lose
    # 3 × 10 / 28 of a tower and the others 3 × 9 / 28.
    vl = model_size(json.loads((CONFIGS / "Qwen--Qwen2.5-VL-7B-Instruct.json").read_text()))
    assert vl.vision is not None
    text = vl.model_copy(update={"vision": None})
    with_tower, without = weights_term(vl, 2, None, 1, 3).bytes, weights_term(text, 2, None, 1, 3).bytes
    tower = with_tower - without
    assert tower > 1024**3  # about 1.26 GiB of the tower's 676,550,144 parameters at 2 B
    kv = 20 * 1024**3
    plain = stage_kv_bytes(text, kv, without, 0, 2, 1, 3)
    assert stage_kv_bytes(vl, kv - tower, with_tower, 0, 2, 1, 3) == [stage - tower for stage in plain]


def test_the_drafter_sits_on_the_last_stage_alone() -> None:
    # vLLM builds the drafter only on the last pipeline rank (gpu_model_runner.py, `get_pp_group().is_last_rank`).
    # Llama-3.1-8B over 2 stages: 16 + 16 layers of K and V × 8 heads × 128 × 2 B = 4,096 B a token each.
    # Stage 0, 10 GiB (10,737,418,240 B), no drafter: 16 × 4,096 × 16 = 1,048,576 B a block → 10,240 blocks.
    # Stage 1, 20 GiB (21,474,836,480 B), with the EAGLE-3 head's layer: 17 × 4,096 × 16 = 1,114,112 B a block
    # → 19,275 blocks. The first stage has fewer: 10,240 blocks. With the head on both stages the first would
    # have been 10,737,418,240 // 1,114,112 = 9,637.
    shape = load_model_shape(str(CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json"))
    eagle = SpeculativeDecoding(method="eagle3", num_speculative_tokens=2)
    whole = predict_pipeline_capacity(shape, [10 * 2**30, 20 * 2**30], block_size=16, max_model_len=8192,
                                      speculative=eagle)
    assert (whole.bytes_per_block, whole.num_blocks) == (1_048_576, 10_240)
    # the same memory on both: the last stage, with one layer more, has the fewest blocks
    level = predict_pipeline_capacity(shape, [10 * 2**30] * 2, block_size=16, max_model_len=8192, speculative=eagle)
    assert (level.bytes_per_block, level.num_blocks) == (1_114_112, 9_637)
