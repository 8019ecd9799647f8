"""Buffers vLLM builds while loading, which its "Model loading took" figure counts beside the weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.predict.load_buffers import with_load_buffers
from harness.predict.term import Term

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"


def _buffers(name: str, batched_tokens: int = 8192) -> Term:
    config: dict[str, Any] = json.loads((CONFIGS / name).read_text())
    return with_load_buffers(Term(name="weights", bytes=0, subtracted=True, source="parameters"), config,
                             batched_tokens, dtype_bytes=2)


def test_the_rope_cache_is_positions_by_rotary_dims_in_the_models_dtype() -> None:
    # Llama-3.1-8B: 131,072 positions × 128 dims × 2 B = 33,554,432 B, what its logs load beyond the parameters.
    llama = _buffers("meta-llama--Llama-3.1-8B-Instruct.json")
    assert llama.bytes == 33_554_432 and "131,072 positions × 128 dims" in llama.source
    # OPT learns its positions: no rotary cache.
    assert _buffers("facebook--opt-125m.json").bytes == 0


def test_multimodal_rope_keeps_four_times_the_positions() -> None:
    # Qwen3.6-35B-A3B: 262,144 positions × 4 (multimodal RoPE) × 64 dims (head_dim 256 × partial_rotary_factor
    # 0.25) × 2 B = 134,217,728 B.
    assert _buffers("Qwen--Qwen3.6-35B-A3B.json").bytes == 134_217_728
    # Qwen3-VL-30B-A3B: 262,144 × 4 × 128 × 2 = 268,435,456 B, and its three deepstack input buffers of 8,192
    # batched tokens × 2,048 × 2 B = 100,663,296 B: 369,098,752 B. Its logs at TP 2 and TP 4 load 0.85 and 0.54
    # GiB beyond the text model, which these and the vision tower's share account for.
    vl = _buffers("Qwen--Qwen3-VL-30B-A3B-Instruct.json")
    assert vl.bytes == 369_098_752 and "× 4 (multimodal RoPE)" in vl.source and "3 deepstack" in vl.source
    assert _buffers("Qwen--Qwen3-VL-30B-A3B-Instruct.json", batched_tokens=2048).bytes == 268_435_456 + 25_165_824


def test_the_rotary_share_is_read_where_transformers_5_writes_it_inside_rope_parameters() -> None:
    # Qwen3.5's hub configs (transformers 5) state partial_rotary_factor 0.25 only inside rope_parameters, where
    # vLLM's get_rope reads it; Qwen3.6-35B-A3B's config without its top-level copy is that form. 262,144 × 4 × 64
    # dims × 2 B = 134,217,728 B, not the 536,870,912 B of all 256: three public Qwen3.5 starts (9B at TP 1 and
    # TP 4, 27B at TP 4) loaded 0.37, 0.37 and 0.30 GiB less than the whole-head cache gave.
    qwen36 = json.loads((CONFIGS / "Qwen--Qwen3.6-35B-A3B.json").read_text())
    text = {key: value for key, value in qwen36["text_config"].items() if key != "partial_rotary_factor"}
    assert text["rope_parameters"]["partial_rotary_factor"] == 0.25
    nested = with_load_buffers(Term(name="weights", bytes=0, subtracted=True, source="parameters"),
                               {**qwen36, "text_config": text}, 8192, dtype_bytes=2)
    assert nested.bytes == 134_217_728 and "× 64 dims" in nested.source
    # A top-level field written as null is not set: vLLM patches only a set one over the nested share.
    written_null = with_load_buffers(Term(name="weights", bytes=0, subtracted=True, source="parameters"),
                                     {**qwen36, "text_config": {**text, "partial_rotary_factor": None}}, 8192,
                                     dtype_bytes=2)
    assert written_null.bytes == 134_217_728
    # GPT-NeoX's configs call it rotary_pct: 2,048 positions × (128 × 0.25 = 32) dims × 2 B = 131,072 B.
    neox = {"architectures": ["GPTNeoXForCausalLM"], "max_position_embeddings": 2048, "hidden_size": 4096,
            "num_attention_heads": 32, "rotary_pct": 0.25}
    assert with_load_buffers(Term(name="weights", bytes=0, subtracted=True, source="parameters"), neox, 8192,
                             dtype_bytes=2).bytes == 131_072


def test_yarn_keeps_its_original_positions_times_its_factor_and_an_impossible_factor_is_refused() -> None:
    # A YaRN rope over 4,096 original positions × 32 = 131,072, × 128 dims × 2 B = 33,554,432 B. A factor of
    # 1e308 (a product no float holds), 0, a negative, NaN or a string sizes no cache: each is refused by name.
    config: dict[str, Any] = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json").read_text())
    weights = Term(name="weights", bytes=0, subtracted=True, source="parameters")
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 32, "original_max_position_embeddings": 4096}
    assert with_load_buffers(weights, config, 8192, dtype_bytes=2).bytes == 33_554_432
    for factor in (1e308, 0, -1, float("nan"), "4"):
        config["rope_scaling"] = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 4096}
        with pytest.raises(HarnessError, match="a YaRN rope_scaling needs original_max_position_embeddings and a "
                           "factor whose product is a length from 1 to"):
            with_load_buffers(weights, config, 8192, dtype_bytes=2)
