"""ModelOpt checkpoints: NVFP4's stored bytes, and the skip lists that can and cannot be priced.

The configs are small ones built for these rules (not model cards). The skip lists are the forms ModelOpt
writes: `["lm_head"]` for a dense model, and for a Qwen3.5-style MoE `["mtp*", "*mlp.gate",
"*shared_expert_gate"]`, which spares only the multi-token-prediction head and the routers.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.errors import HarnessError
from harness.predict.parameter_count import model_size
from harness.predict.weight_formats import check_modelopt_skips
from harness.predict.weights import weights_term

DENSE: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                         "vocab_size": 1000, "tie_word_embeddings": False}
MOE: dict[str, Any] = {**DENSE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8,
                       "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def _nvfp4(config: dict[str, Any], ignore: list[str]) -> dict[str, Any]:
    return {**config, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ignore}}


def test_nvfp4_stores_four_and_a_half_bits_a_linear_weight_and_keeps_embeddings_16_bit() -> None:
    # head_dim 64 / 4 = 16; attention 64 × 16 × (2 × 4 + 2 × 4) = 16,384 and MLP 3 × 64 × 128 = 24,576 a layer,
    # × 2 layers = 81,920 linear weights at 4 + 8 / 16 = 4.5 bits: 46,080 B. Embedding and LM head
    # 2 × 1,000 × 64 = 128,000 parameters at 2 B: 256,000 B. Together 302,080 B.
    assert weights_term(model_size(DENSE), 2, "modelopt_fp4", 1).bytes == 302_080


def test_modelopt_fp8_stores_one_byte_a_linear_weight() -> None:
    # 81,920 linear weights at 1 B + 256,000 B of embeddings = 337,920 B.
    assert weights_term(model_size(DENSE), 2, "modelopt", 1).bytes == 337_920


@pytest.mark.parametrize(("config", "ignore"), [(DENSE, ["lm_head"]),
                                                (MOE, ["mtp*", "*mlp.gate", "*shared_expert_gate"])])
def test_a_skip_list_that_spares_no_decoder_linear_is_priced(config: dict[str, Any], ignore: list[str]) -> None:
    check_modelopt_skips(_nvfp4(config, ignore), model_size(config), "modelopt_fp4")  # raises if refused


@pytest.mark.parametrize(("config", "ignore", "named"), [
    (DENSE, ["lm_head", "model.layers.*.self_attn*"], "model.layers.*.self_attn*"),
    (DENSE, ["model.layers.1.mlp"], "model.layers.1.mlp"),
    (MOE, ["*mlp.gate", "model.layers.0.mlp.experts*"], "model.layers.0.mlp.experts*"),
])
def test_a_skip_list_that_keeps_decoder_layers_16_bit_is_refused_by_pattern(
        config: dict[str, Any], ignore: list[str], named: str) -> None:
    with pytest.raises(HarnessError, match="keeps decoder layers 16-bit") as refusal:
        check_modelopt_skips(_nvfp4(config, ignore), model_size(config), "modelopt_fp4")
    assert named in str(refusal.value)
    assert "*mlp.gate" not in str(refusal.value) and "lm_head" not in str(refusal.value)


def test_a_checkpoint_without_its_quantization_config_is_refused_not_guessed() -> None:
    with pytest.raises(HarnessError, match="quantization_config"):
        check_modelopt_skips(DENSE, model_size(DENSE), "modelopt_fp4")


def test_the_legacy_hf_quant_config_form_is_read() -> None:
    legacy = {**DENSE, "quantization_config": {"quantization": {"quant_algo": "NVFP4",
                                                                "exclude_modules": ["model.layers.0.self_attn"]}}}
    with pytest.raises(HarnessError, match=r"model\.layers\.0\.self_attn"):
        check_modelopt_skips(legacy, model_size(DENSE), "modelopt_fp4")
