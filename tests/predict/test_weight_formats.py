"""Checkpoint formats: bits per stored weight from the checkpoint's quantization_config, and the skip lists that can
and cannot be priced.

The small configs are built for these rules (not model cards). The skip lists are the forms the tools write:
ModelOpt's `["lm_head"]` for a dense model and `["mtp*", "*mlp.gate", "*shared_expert_gate"]` for a
Qwen3.5-style MoE (sparing only the multi-token-prediction head and the routers); compressed-tensors' regexes
for Kimi-K2-Thinking, whose int4 covers the routed experts alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.predict.model_shape import load_model_shape
from harness.predict.parameter_count import model_size
from harness.predict.weight_formats import CLASS_LINEARS, weight_format
from harness.predict.weights import weights_term
from harness.units import GiB

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"
DENSE: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                         "vocab_size": 1000, "tie_word_embeddings": False}
MOE: dict[str, Any] = {**DENSE, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8,
                       "num_experts_per_tok": 2, "moe_intermediate_size": 32}
# DENSE: head_dim 64 / 4 = 16; attention 64 × 16 × (2 × 4 + 2 × 4) = 16,384 and MLP 3 × 64 × 128 = 24,576 a
# layer, × 2 layers = 81,920 linear weights; embedding and LM head 2 × 1,000 × 64 = 128,000 at 2 B = 256,000 B.
DENSE_LINEAR, DENSE_EMBEDDING_BYTES = 81_920, 256_000


def _priced(config: dict[str, Any], quantization: str | None = None, tp: int = 1) -> int:
    size = model_size(config)
    return weights_term(size, 2, weight_format(quantization, config, size), tp).bytes


def _with(config: dict[str, Any], quantization_config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "quantization_config": quantization_config}


def _nvfp4(config: dict[str, Any], ignore: list[str]) -> dict[str, Any]:
    return _with(config, {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ignore})


def test_nvfp4_stores_four_and_a_half_bits_a_linear_weight_and_keeps_embeddings_16_bit() -> None:
    # 81,920 linear weights at 4 + 8 / 16 = 4.5 bits: 46,080 B, + 256,000 B of embeddings = 302,080 B.
    assert _priced(_nvfp4(DENSE, ["lm_head"]), "modelopt_fp4") == 302_080


def test_modelopt_fp8_stores_one_byte_a_linear_weight() -> None:
    # 81,920 linear weights at 1 B + 256,000 B of embeddings = 337,920 B.
    config = _with(DENSE, {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": []})
    assert _priced(config, "modelopt") == 337_920


def test_the_checkpoints_own_config_sets_the_format_when_no_flag_names_one() -> None:
    # vLLM reads quant_method from config.json; a 4-bit GPTQ checkpoint at groups of 64 stores
    # 4 + (4 + 16) / 64 = 4.3125 bits a weight: 81,920 × 4.3125 / 8 = 44,160 B, + 256,000 = 300,160 B.
    config = _with(DENSE, {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True})
    assert _priced(config) == 300_160
    assert _priced(config, "gptq_marlin") == 300_160  # the Marlin kernel holds the same weights
    rounded = _with(DENSE, {"quant_method": "auto-round", "bits": 4, "group_size": 64, "sym": True})
    assert _priced(rounded, "gptq_marlin") == 300_160  # an AutoRound checkpoint as a log names its kernel
    # without the config the flag gets GPTQ's usual groups of 128: 4.15625 bits, 42,560 B + 256,000
    assert _priced(DENSE, "gptq") == 298_560


def test_an_eight_bit_awq_checkpoint_is_priced_at_its_own_bits() -> None:
    # w_bit 8, q_group_size 64 (AutoAWQ's spelling): 8 + (8 + 16) / 64 = 8.375 bits; 81,920 × 8.375 / 8 =
    # 85,760 B, + 256,000 = 341,760 B.
    assert _priced(_with(DENSE, {"quant_method": "awq", "w_bit": 8, "q_group_size": 64})) == 341_760


def test_a_flag_alone_says_which_bits_it_assumed_where_the_format_has_others() -> None:
    # GPTQ's kernels take 2, 3, 4 and 8 bits and Qwen publishes Int4 and Int8 builds alike: priced from the flag
    # alone, the source says it took 4 and where the others are read. FP8 has one width, so it says nothing more.
    size = model_size(DENSE)
    gptq = weight_format("gptq", DENSE, size)
    assert gptq is not None and "4-bit; its kernels also take 2/3/8-bit checkpoints" in gptq.source
    awq = weight_format("awq_marlin", DENSE, size)
    assert awq is not None and "also take 8-bit" in awq.source
    fp8 = weight_format("fp8", DENSE, size)
    assert fp8 is not None and fp8.source == "--quantization fp8, the format's usual layout"


def test_compressed_tensors_group_int4_stores_scales_and_zero_points_only_where_asymmetric() -> None:
    def scheme(symmetric: bool) -> dict[str, Any]:
        weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": symmetric}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ["lm_head"]}
    # symmetric: 4 + 16 / 32 = 4.5 bits, 46,080 B; asymmetric adds a packed 4-bit zero point a group:
    # 4 + 20 / 32 = 4.625 bits, 47,360 B. Each + 256,000 B of embeddings.
    assert _priced(_with(DENSE, scheme(True))) == 302_080
    assert _priced(_with(DENSE, scheme(False))) == 303_360


def test_kimi_k2_thinking_holds_its_routed_experts_in_int4_and_the_rest_in_bf16() -> None:
    # Per layer: MLA attention 7,168 × 1,536 + 1,536 × 64 × 192 + 7,168 × 576 + 512 × 64 × 256 + 64 × 128 ×
    # 7,168 = 101,122,048; × 61 = 6,168,444,928. One dense layer 3 × 7,168 × 18,432 = 396,361,728. 60 MoE
    # layers of 384 routed experts, 3 × 7,168 × 2,048 × 384 × 60 = 1,014,686,023,680, a shared expert
    # 3 × 7,168 × 2,048 × 60 = 2,642,411,520 and routers 7,168 × 384 × 60 = 165,150,720.
    # The routed experts at 4 + 16 / 32 = 4.5 bits: 570,760,888,320 B; the other 9,372,368,896 linear weights
    # and 2 × 163,840 × 7,168 = 2,348,810,240 embedding weights in bf16: 23,442,358,272 B. Together
    # 594,203,246,592 B, the 594.2 GB model listings record for the hub checkpoint. Over TP 8 an eighth, 74,275,405,824
    # B, but for what every rank holds whole: the MLA down-projections (7,168 × 1,536 + 7,168 × 576) × 61 =
    # 923,467,776 and the routers 165,150,720, 1,088,618,496 bf16 weights of which 7/8 more a rank,
    # 952,541,184 × 2 B = 1,905,082,368. 76,180,488,192 B a GPU.
    config = load_model_shape(str(CONFIGS / "moonshotai--Kimi-K2-Thinking.json")).config
    size = model_size(config)
    fmt = weight_format("compressed-tensors", config, size)
    assert fmt is not None and (fmt.quantized, fmt.bits) == (("routed",), 4.5)
    assert weights_term(size, 2, fmt, 1).bytes == 594_203_246_592
    assert weights_term(size, 2, fmt, 8).bytes == 76_180_488_192
    assert round(76_180_488_192 / GiB, 2) == 70.95


def test_mxfp4_applies_to_the_experts_alone_whatever_the_flag_says() -> None:
    config = _with(MOE, {"quant_method": "mxfp4"})
    fmt = weight_format(None, config, model_size(config))
    assert fmt is not None and (fmt.method, fmt.quantized) == ("mxfp4", ("routed",))


def test_a_kind_the_skip_list_spares_in_every_layer_stays_16_bit_and_the_rest_is_quantized() -> None:
    # A Qwen2-MoE-style model (one shared expert of width 32 behind a one-output gate) whose AWQ checkpoint leaves
    # its shared experts alone. Per layer: attention 16,384, routed experts 3 × 64 × 32 × 8 = 49,152, the shared
    # expert 3 × 64 × 32 = 6,144, router 64 × 8 = 512 and shared gate 64; × 2 layers: 32,768, 98,304, 12,288 and
    # 1,152. Attention and routed experts at 4 + 20 / 64 bits: 131,072 × 4.3125 / 8 = 70,656 B; the shared
    # experts, router and gates in bf16: 13,440 × 2 = 26,880 B; embeddings 256,000 B. Together 353,536 B.
    shared = {**MOE, "architectures": ["Qwen2MoeForCausalLM"], "shared_expert_intermediate_size": 32}
    config = _with(shared, {"quant_method": "awq", "bits": 4, "group_size": 64,
                            "modules_to_not_convert": ["mlp.shared_expert"]})
    fmt = weight_format(None, config, model_size(config))
    assert fmt is not None and fmt.quantized == ("mixer", "routed")
    assert weights_term(model_size(config), 2, fmt, 1).bytes == 353_536


def test_attention_spared_in_every_layer_is_held_16_bit_beside_an_nvfp4_mlp() -> None:
    # MLP 2 × 3 × 64 × 128 = 49,152 weights at 4.5 bits = 27,648 B; attention 32,768 at 2 B = 65,536 B;
    # embeddings 256,000 B. Together 349,184 B.
    config = _nvfp4(DENSE, ["lm_head", "model.layers.*.self_attn*"])
    fmt = weight_format("modelopt_fp4", config, model_size(config))
    assert fmt is not None and fmt.quantized == ("dense",)
    assert weights_term(model_size(config), 2, fmt, 1).bytes == 349_184


@pytest.mark.parametrize(("config", "ignore"), [(DENSE, ["lm_head"]),
                                                (MOE, ["mtp*", "*mlp.gate", "*shared_expert_gate"])])
def test_a_skip_list_that_spares_no_decoder_linear_is_priced_whole(config: dict[str, Any], ignore: list[str]) -> None:
    fmt = weight_format("modelopt_fp4", _nvfp4(config, ignore), model_size(config))
    assert fmt is not None
    assert fmt.quantized == (("mixer", "routed") if config is MOE else ("mixer", "dense"))


@pytest.mark.parametrize(("config", "ignore", "named"), [
    (DENSE, ["lm_head", "model.layers.0.self_attn*"], "model.layers.0.self_attn*"),
    (DENSE, ["model.layers.1.mlp"], "model.layers.1.mlp"),
    (MOE, ["*mlp.gate", "model.layers.0.mlp.experts*"], "model.layers.0.mlp.experts*"),
])
def test_a_skip_list_that_keeps_some_decoder_layers_16_bit_is_refused_by_pattern(
        config: dict[str, Any], ignore: list[str], named: str) -> None:
    with pytest.raises(HarnessError, match="keeps some decoder layers 16-bit") as refusal:
        weight_format("modelopt_fp4", _nvfp4(config, ignore), model_size(config))
    assert named in str(refusal.value)
    assert "*mlp.gate" not in str(refusal.value) and "lm_head" not in str(refusal.value)


@pytest.mark.parametrize(("flag", "refusal"), [
    ("modelopt_fp4", "quantization_config names them"),
    ("compressed-tensors", "quantization_config states them"),
    ("int4", r"'int4' is not priced here \(known: fp8"),
])
def test_a_format_whose_layout_is_the_checkpoints_own_is_refused_without_its_config(flag: str, refusal: str) -> None:
    with pytest.raises(HarnessError, match=refusal):
        weight_format(flag, DENSE, model_size(DENSE))


def test_a_flag_that_contradicts_the_checkpoints_config_is_refused_as_vllm_refuses_it() -> None:
    config = _with(DENSE, {"quant_method": "awq", "bits": 4, "group_size": 128})
    with pytest.raises(HarnessError, match=r"--quantization gptq: .* says quant_method 'awq'"):
        weight_format("gptq", config, model_size(DENSE))


def test_an_unpriced_method_in_the_config_is_named() -> None:
    config = _with(DENSE, {"quant_method": "hqq"})
    with pytest.raises(HarnessError, match="quant_method 'hqq' is not priced here"):
        weight_format(None, config, model_size(DENSE))


def test_the_legacy_hf_quant_config_form_is_read() -> None:
    legacy = _with(DENSE, {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["model.layers.0.self_attn"]}})
    with pytest.raises(HarnessError, match=r"model\.layers\.0\.self_attn"):
        weight_format("modelopt_fp4", legacy, model_size(DENSE))


@pytest.mark.parametrize(("stated", "named"), [
    ({"quant_method": "gptq", "bits": "4"}, "field 'bits' must be a whole number from 1 to 16, got '4'"),
    ({"quant_method": "awq", "w_bit": 0}, "field 'w_bit'"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 12.5}, "field 'group_size'"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": True}}}},
     "field 'num_bits'"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4}}},
      "ignore": ["re:model.layers.(.self_attn"]}, "ignore pattern 're:model.layers.(.self_attn' is not a regular"),
    ({"quant_method": "compressed-tensors", "config_groups": "group_0"}, "no weight schemes"),
    ({"bits": 4}, "names no quant_method"),
    ({"quant_method": 7}, "quant_method '7' is not priced here"),
])
def test_a_malformed_quantization_config_is_refused_by_field_not_by_traceback(stated: dict[str, Any],
                                                                              named: str) -> None:
    with pytest.raises(HarnessError) as refusal:
        weight_format(None, _with(DENSE, stated), model_size(DENSE))
    assert named in str(refusal.value)


@pytest.mark.parametrize(("stated", "named"), [
    ({"quant_method": "awq", "w_bit": 3, "q_group_size": 64}, "awq at 3 bits is refused by vLLM, whose awq kernels "
                                                              "take 4, 8 bits"),
    ({"quant_method": "gptq", "bits": 5, "group_size": 64}, "gptq at 5 bits"),
    ({"quant_method": "auto-round", "bits": 6, "group_size": 64}, "auto-round at 6 bits"),
    # DENSE's hidden size is 64: a group of 3, or of 128, leaves its first projections' inputs split mid-group
    ({"quant_method": "awq", "bits": 4, "group_size": 3}, "groups of 3 inputs do not divide the hidden size 64"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "groups of 128 inputs do not divide"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 4, "strategy": "group", "group_size": 48}}}}, "groups of 48 inputs do not divide"),
])
def test_a_layout_vllms_kernels_refuse_is_refused_naming_the_field(stated: dict[str, Any], named: str) -> None:
    with pytest.raises(HarnessError) as refusal:
        weight_format(None, _with(DENSE, stated), model_size(DENSE))
    assert named in str(refusal.value)


def test_a_group_of_one_per_output_channel_fits_any_hidden_size() -> None:
    # GPTQ's -1 (and 0) mean one scale per output row, whatever the width: priced at the 4 bits alone, not refused.
    for group in (-1, 0):
        config = _with(DENSE, {"quant_method": "gptq", "bits": 4, "group_size": group})
        fmt = weight_format(None, config, model_size(DENSE))
        assert fmt is not None and fmt.bits == 4


def test_odd_but_harmless_fields_are_read_as_vllm_reads_them() -> None:
    # A lone module name is a one-name list; an extra_config entry without bits leaves its module quantized.
    lone = _with(DENSE, {"quant_method": "awq", "bits": 4, "group_size": 32, "modules_to_not_convert": "visual"})
    rounded = _with(DENSE, {"quant_method": "auto-round", "bits": 4, "group_size": 32,
                            "extra_config": {"model.layers.0.self_attn.q_proj": {"data_type": "int"}}})
    for config in (lone, rounded):
        fmt = weight_format(None, config, model_size(DENSE))
        assert fmt is not None and (fmt.quantized, fmt.bits) == (("mixer", "dense"), 4 + 20 / 32)


def test_every_kind_of_linear_the_formats_name_has_its_parameter_count() -> None:
    # A kind named in one table and not the other would be priced at neither bits nor dtype.
    size = model_size(MOE)
    assert set(size.rank_params_by_kind(1)) == {*CLASS_LINEARS, "router"}
    assert size.router_params > 0
    assert sum(size.rank_params_by_kind(1).values()) == size.linear_params  # on one rank, every linear whole
