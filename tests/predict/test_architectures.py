"""Architectures outside the gated Llama mould: their names, widths and tied embeddings read as vLLM loads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.predict.architectures import language_config
from harness.predict.memory_model import model_size
from harness.predict.model_shape import parse_config

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"

# openai-community/gpt2's config.json, the fields the calculator reads: GPT-2's own names, no
# intermediate width (n_inner null: 4 × n_embd) and no tie_word_embeddings field.
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
        "n_positions": 1024, "n_inner": None, "vocab_size": 50257}


def test_gpt2_names_are_read_and_its_parameter_count_is_the_published_one_less_positions_and_biases() -> None:
    size = model_size(GPT2)
    # attention 4 × 768² = 2,359,296, MLP (c_fc, c_proj: ungated) 2 × 768 × 3,072 = 4,718,592, so 12 layers hold
    # 84,934,656; the tied embedding 50,257 × 768 = 38,597,376 once: 123,532,032. GPT-2 small's published 124,439,808
    # less its 1,024 × 768 = 786,432 position embeddings and 12 × 9,984 + 1,536 = 121,344 biases and norms (per
    # layer: qkv 2,304 + proj 768 + fc 3,072 + proj 768 + two norms 3,072) is the same 123,532,032.
    assert size.linear_params + size.embedding_params == 124_439_808 - 786_432 - 121_344
    layers, _ = parse_config(GPT2, source="gpt2")
    # multi-head attention: 12 KV heads of 768 / 12 = 64 in each of 12 layers
    assert [(layer.kv_heads, layer.head_dim) for layer in layers] == [(12, 64)] * 12
    assert language_config(GPT2)["max_position_embeddings"] == 1024


def test_an_absent_tie_field_takes_the_familys_default() -> None:
    shape = {"hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1,
             "head_dim": 256, "intermediate_size": 16384, "vocab_size": 256000}
    gemma = model_size({**shape, "architectures": ["GemmaForCausalLM"], "model_type": "gemma"})
    llama = model_size({**shape, "architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    # Gemma ties its output layer to the input embedding (GemmaConfig's default), Llama does not:
    # 256,000 × 2,048 = 524,288,000 once against twice
    assert gemma.embedding_params == 524_288_000
    assert llama.embedding_params == 2 * 524_288_000
    stated = model_size({**shape, "architectures": ["GemmaForCausalLM"], "model_type": "gemma",
                         "tie_word_embeddings": False})
    assert stated.embedding_params == 2 * 524_288_000  # a stated field wins over the default


def test_opt_width_is_its_ffn_dim_and_its_mlp_is_ungated() -> None:
    # facebook/opt-125m's config.json: hidden 768, 12 layers of 12 heads, ffn_dim 3,072, vocab 50,272, tied
    opt = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768, "num_hidden_layers": 12,
           "num_attention_heads": 12, "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048}
    size = model_size(opt)
    # 12 × (4 × 768² + 2 × 768 × 3,072) = 12 × 7,077,888 = 84,934,656; embeddings 50,272 × 768 = 38,608,896 once
    assert size.linear_params == 84_934_656
    assert size.embedding_params == 38_608_896


@pytest.mark.parametrize(("architecture", "reason"), [
    ("MllamaForConditionalGeneration", "cross-attention layers keep each request's image tokens"),
    ("InternVLChatModel", "InternViT vision tower"),
    ("Phi3VForCausalLM", "CLIP image processor"),
])
def test_a_known_family_the_calculator_would_misstate_is_refused_with_its_reason(architecture, reason) -> None:
    config = {"architectures": [architecture], "hidden_size": 4096, "num_hidden_layers": 32,
              "num_attention_heads": 32, "vocab_size": 32000}
    with pytest.raises(HarnessError, match=f"{architecture} is refused: .*{reason}"):
        parse_config(config, source="config.json")


# HuggingFaceTB/SmolLM3-3B's config.json as copied in the fetchwiki/HuggingFaceTB-SmolLM3-3B repository (config.json),
# the fields read: every layer full attention in layer_types (no_rope_layers only drops the rotary embedding on
# every fourth layer), no sliding window, and no tie_word_embeddings field, so SmolLM3Config's default (tied).
SMOLLM3 = {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 2048,
           "intermediate_size": 11008, "layer_types": ["full_attention"] * 36, "max_position_embeddings": 65536,
           "max_window_layers": 28, "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0] * 9,
           "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4, "sliding_window": None,
           "use_sliding_window": False, "vocab_size": 128256}


def test_smollm3_keeps_full_attention_on_every_layer_and_ties_its_embeddings() -> None:
    layers, _ = parse_config(SMOLLM3, source="smollm3")
    # 4 KV heads of 2,048 / 16 = 128 on all 36 layers, the NoPE ones included (vLLM serves it through its
    # Transformers backend, which gives every layer an attention KV cache)
    assert [(layer.kind.value, layer.kv_heads, layer.head_dim) for layer in layers] == [("full_attention", 4, 128)] * 36
    size = model_size(SMOLLM3)
    # per layer: attention 2,048 × 128 × (2 × 16 + 2 × 4) = 10,485,760, gated MLP 3 × 2,048 × 11,008 = 67,633,152;
    # 36 layers: 2,812,280,832; the tied embedding 128,256 × 2,048 = 262,668,288 once: 3,074,949,120. Its norms
    # (two of 2,048 per layer and a final one: 36 × 4,096 + 2,048 = 149,504) make the 3,075,098,624 parameters
    # that the hub's two bf16 shards hold: 4,966,315,264 + 1,183,919,744 = 6,150,235,008 bytes, which is
    # 2 × 3,075,098,624 = 6,150,197,248 bytes of tensors and 37,760 bytes of the two safetensors headers.
    assert size.embedding_params == 262_668_288
    assert size.linear_params + size.embedding_params == 3_075_098_624 - 149_504
    assert 0 < 4_966_315_264 + 1_183_919_744 - 2 * 3_075_098_624 < 64 * 1024


# LGAI-EXAONE/EXAONE-4.0-1.2B's config.json fields, as copied with a quantized derivative in the
# his0si/EXAONE-4.0-1.2B repository (model/config.json; its quantization_config changes no shape read here):
# 30 layers, all full attention in layer_types (vLLM's exaone4.py gives a layer the sliding window where
# layer_types says sliding_attention, as parse_config reads it), explicit head_dim 64, tied embeddings.
EXAONE4 = {"architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "head_dim": 64, "hidden_size": 2048,
           "intermediate_size": 4096, "layer_types": ["full_attention"] * 30, "max_position_embeddings": 65536,
           "num_attention_heads": 32, "num_hidden_layers": 30, "num_key_value_heads": 8, "sliding_window": None,
           "sliding_window_pattern": None, "tie_word_embeddings": True, "vocab_size": 102400}


def test_exaone4_reads_its_layer_types_and_its_count_without_embeddings_is_the_published_one() -> None:
    layers, _ = parse_config(EXAONE4, source="exaone4")
    assert [(layer.kind.value, layer.kv_heads, layer.head_dim) for layer in layers] == [("full_attention", 8, 64)] * 30
    size = model_size(EXAONE4)
    # per layer: attention 2,048 × 64 × (2 × 32 + 2 × 8) = 10,485,760, gated MLP 3 × 2,048 × 4,096 = 25,165,824;
    # 30 layers: 1,069,547,520, the model card's "Number of Parameters (without embeddings): 1.07B" (its q/k norms
    # and post-norms, 30 × (2 × 2,048 + 2 × 64) + 2,048 = 128,768, do not move the rounding); the tied embedding
    # 102,400 × 2,048 = 209,715,200 once
    assert size.linear_params == 1_069_547_520
    assert round(size.linear_params / 1e9, 2) == 1.07
    assert size.embedding_params == 209_715_200


@pytest.mark.parametrize(("config_file", "kinds"), [
    # gpt-oss-20b: 24 layers, transformers' GptOssConfig alternates sliding (even) and full (odd) layers
    ("openai--gpt-oss-20b.json", ["sliding_window", "full_attention"] * 12),
    # Qwen3.6-35B-A3B: 40 layers, full attention every 4th (full_attention_interval 4), linear attention between
    ("Qwen--Qwen3.6-35B-A3B.json", ["state", "state", "state", "full_attention"] * 10),
])
def test_a_config_without_its_layer_types_takes_its_familys_layout(config_file, kinds) -> None:
    config = json.loads((CONFIGS / config_file).read_text())
    stated, _ = parse_config(config)
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, "text_config": {k: v for k, v in text.items() if k != "layer_types"}}
    else:
        config = {k: v for k, v in config.items() if k != "layer_types"}
    derived, _ = parse_config(config)
    assert [spec.kind.value for spec in derived] == [spec.kind.value for spec in stated] == kinds
