"""Gemma 4's KV cache, held against three real start-up logs (tests/fixtures/field): its full-attention layers keep
heads of their own, its small models' last layers reuse an earlier layer's cache, and vLLM gives its two page
sizes one page by raising the smaller page's block size.

The configs below hold only the fields the calculator reads, as google/gemma-4-26B-A4B-it's and
google/gemma-4-E4B-it's config.json state them (the same values appear in several public ports of the model);
the corpus ships no Gemma 4 config, so these cases stay unscored there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.calibrate.field_corpus import load_corpus
from harness.errors import HarnessError
from harness.observe.capacity import build_capacity_report
from harness.predict.budget import Population, estimate_budget, predict_capacity
from harness.predict.memory_model import model_size
from harness.predict.model_shape import LayerKind, load_model_shape, parse_config
from harness.predict.pipeline import pipeline_stages
from harness.units import GiB

from run_records import FIELD

SIX = ["sliding_attention"] * 5 + ["full_attention"]  # five sliding-window layers, then one full
A4B_TEXT = {"model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16,
            "num_key_value_heads": 8, "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512,
            "attention_k_eq_v": True, "sliding_window": 1024, "layer_types": SIX * 5, "num_kv_shared_layers": 0,
            "vocab_size": 262144, "intermediate_size": 2112, "enable_moe_block": True, "num_experts": 128,
            "top_k_experts": 8, "moe_intermediate_size": 704, "max_position_embeddings": 262144,
            "tie_word_embeddings": True}
E4B_TEXT = {"model_type": "gemma4_text", "hidden_size": 2560, "num_hidden_layers": 42, "num_attention_heads": 8,
            "num_key_value_heads": 2, "num_global_key_value_heads": None, "head_dim": 256, "global_head_dim": 512,
            "attention_k_eq_v": False, "sliding_window": 512, "layer_types": SIX * 7, "num_kv_shared_layers": 18,
            "vocab_size": 262144, "intermediate_size": 10240, "hidden_size_per_layer_input": 256,
            "max_position_embeddings": 131072, "tie_word_embeddings": True}


def gemma4(text: dict[str, Any]) -> dict[str, Any]:
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "torch_dtype": "bfloat16",
            "text_config": text}


def written(tmp_path: Path, text: dict[str, Any]) -> str:
    (tmp_path / "config.json").write_text(json.dumps(gemma4(text)))
    return str(tmp_path)


def test_full_layers_keep_their_own_heads_and_shared_layers_keep_no_cache() -> None:
    layers, notes = parse_config(gemma4(A4B_TEXT), source="26B-A4B")
    # attention_k_eq_v: the 5 full layers keep num_global_key_value_heads 2 of global_head_dim 512; the 25
    # sliding ones num_key_value_heads 8 of head_dim 256, over a 1,024-token window
    assert [(x.kind, x.kv_heads, x.head_dim, x.window_tokens) for x in layers] == (
        [(LayerKind.SLIDING_WINDOW, 8, 256, 1024)] * 5 + [(LayerKind.FULL_ATTENTION, 2, 512, None)]) * 5
    layers, notes = parse_config(gemma4(E4B_TEXT), source="E4B")
    # 42 − 18 shared = 24 layers keep a cache, 4 of them full (layers 5, 11, 17, 23): without attention_k_eq_v the
    # full layers keep num_key_value_heads 2, of global_head_dim 512
    assert len(layers) == 24
    assert [(x.kind, x.kv_heads, x.head_dim) for x in layers if x.kind is LayerKind.FULL_ATTENTION] == [
        (LayerKind.FULL_ATTENTION, 2, 512)] * 4
    assert any("num_kv_shared_layers" in note for note in notes)


@pytest.mark.parametrize(("case_id", "text"), [
    # 0.20.2 on an H200, 32,768 tokens, 8,192 batched: sliding layers 8 × 256 × 2 (K, V) × 2 B = 8,192 B a token,
    # a 16-token page of 131,072; full layers 2 × 512 × 2 × 2 = 4,096 B, so their block is raised to 32 tokens for
    # the same page. 25 sliding and 5 full layers: groups of 5, six groups, 655,360 B a block. 71.67 GiB =
    # 76,955,076,526 B hold 117,424 blocks; a request takes 32,768 / 32 = 1,024 full blocks and 5 × (⌈(1,023 +
    # 8,192) / 16⌉ + 1) = 5 × 577 = 2,885 sliding ones, 3,909 in all: 30.04x, and 30.0394 × 32,768 = 984,330
    # tokens (0.20.1 on derive them), against 984,297 logged, inside the print's ±0.005 GiB.
    ("v0202-gemma4-26b-a4b-h200-len32768", A4B_TEXT),
    # 0.19.2rc1.dev206: 24 cached layers, 20 sliding of 2 × 256 × 2 × 2 = 2,048 B a token (a 32,768 B page at 16
    # tokens, raised to 32 tokens) and 4 full of 4,096 B (65,536 B): groups of 4, six groups, 262,144 B a block.
    # 16.45 GiB = 17,663,053,004 B hold 67,379 blocks; a request takes 16,384 / 16 = 1,024 full blocks and 5 ×
    # (⌈(511 + 2,048) / 32⌉ + 1) = 405 sliding ones, 1,429: 47.15x, and 67,379 // 6 × 16 = 179,664 tokens,
    # against 179,632 and 47.14x logged, inside the print's rounding.
    ("v0192-gemma4-e4b-len16384-util085", E4B_TEXT),
    # 0.25.1 on a GB10 (an AWQ checkpoint of 26B-A4B: its cache is bfloat16), 262,144 tokens, 2,496 batched:
    # 83.89 GiB hold 137,445 blocks of 655,360 B; a request takes 262,144 / 32 = 8,192 full blocks and 5 ×
    # (⌈(1,023 + 2,496) / 16⌉ + 1) = 1,105 sliding ones, 9,297: 14.78x, 3,875,484 tokens against 3,875,400.
    ("v0251-gemma4-26b-a4b-awq-gb10-len262144", A4B_TEXT),
])
def test_three_real_gemma4_starts_are_predicted_within_their_logs_rounding(
    case_id: str, text: dict[str, Any], tmp_path: Path
) -> None:
    cases, _ = load_corpus(FIELD)
    log = next(case for case in cases if case.id == case_id).parsed()
    report = build_capacity_report(log, None, model=written(tmp_path, text))
    assert report.prediction is not None, report.prediction_note
    expected = {"v0202-gemma4-26b-a4b-h200-len32768": (117_424, 3_909, 984_330),
                "v0192-gemma4-e4b-len16384-util085": (67_379, 1_429, 179_664),
                "v0251-gemma4-26b-a4b-awq-gb10-len262144": (137_445, 9_297, 3_875_484)}[case_id]
    prediction = report.prediction
    assert (prediction.num_blocks, prediction.blocks_per_request, prediction.kv_cache_tokens) == expected
    assert report.prediction_matches_log is True and report.disagreements == []


def test_a_sequence_is_padded_to_each_layer_kinds_own_block(tmp_path: Path) -> None:
    shape = load_model_shape(written(tmp_path, A4B_TEXT))
    # 26B-A4B, one sequence of 1,000 tokens, under 0.20.2: the 25 sliding layers hold 8,192 B a token in 16-token
    # blocks, ⌈1,000 / 16⌉ = 63 of them (the 1,024-token window is not reached): 25 × 63 × 16 × 8,192 = 206,438,400;
    # the 5 full layers hold 4,096 B a token in blocks raised to 32 tokens, ⌈1,000 / 32⌉ = 32 of them:
    # 5 × 32 × 32 × 4,096 = 20,971,520. Raw: 1,000 × (25 × 8,192 + 5 × 4,096) = 225,280,000.
    result = estimate_budget(shape, Population.uniform(1, 1000), engine_version="0.20.2")
    assert (result.sequences[0].kv_bytes_raw, result.sequences[0].kv_bytes_padded) == (
        225_280_000, 206_438_400 + 20_971_520)
    assert any("block size raised from 16 to 32" in note for note in result.assumptions)
    # before 0.12 no page is unified: the full layers pad to 16 tokens, 63 × 16 = 1,008 of them
    older = estimate_budget(shape, Population.uniform(1, 1000), engine_version="0.11.2")
    assert older.sequences[0].kv_bytes_padded == 206_438_400 + 5 * 63 * 16 * 4_096


def test_before_0_12_unequal_pages_are_refused_as_vllm_could_not_unify_them(tmp_path: Path) -> None:
    shape = load_model_shape(written(tmp_path, A4B_TEXT))
    with pytest.raises(HarnessError, match=r"different page sizes \[65536, 131072\] are not modelled"):
        predict_capacity(shape, available_kv_bytes=10 * GiB, block_size=16, max_model_len=8192,
                         engine_version="0.11.2")


def test_the_weights_are_refused_by_name_and_kv_sharing_under_pipeline_parallelism(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="the weights of Gemma4ForConditionalGeneration are not modelled: Gemma 4's "
                                           "per-layer embeddings"):
        model_size(gemma4(A4B_TEXT))
    shape = load_model_shape(written(tmp_path, E4B_TEXT))
    with pytest.raises(HarnessError, match=r"pipeline parallelism over layers that share another layer's KV cache"):
        pipeline_stages(shape, 2)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_kv_shared_layers", 42, "'num_kv_shared_layers' must be a whole number below num_hidden_layers"),
    ("num_kv_shared_layers", -1, "'num_kv_shared_layers' must be a whole number"),
    ("attention_k_eq_v", "yes", "'attention_k_eq_v' must be true or false, got 'yes'"),
    ("global_head_dim", 0, "'global_head_dim' must be a positive integer"),
])
def test_a_damaged_gemma4_field_is_named(field: str, value: object, message: str) -> None:
    with pytest.raises(HarnessError, match=message):
        parse_config(gemma4({**E4B_TEXT, field: value}), source="E4B")
