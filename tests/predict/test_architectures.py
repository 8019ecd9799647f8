"""Architectures outside the gated Llama mould: their names, widths and tied embeddings read as vLLM loads them."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.predict.architectures import language_config
from harness.predict.memory_model import model_size
from harness.predict.model_shape import parse_config

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
