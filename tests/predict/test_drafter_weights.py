"""An MTP drafter's own weights in the before-launch waterfall, and what is said of drafters not counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.predict.engine_launch import EngineLaunch
from harness.predict.fit_answer import answer_fit
from harness.predict.memory_model import FITTED_CONSTANTS, Waterfall, plan_waterfall
from harness.predict.model_shape import load_model_shape
from harness.predict.parameter_count import full_attention_layer_params, model_size
from harness.predict.speculative import SpeculativeDecoding
from harness.predict.weights import drafter_weights_term
from harness.units import GiB

QWEN36_PATH = Path(__file__).parents[1] / "fixtures" / "field" / "configs" / "Qwen--Qwen3.6-35B-A3B.json"
QWEN36_35B = json.loads(QWEN36_PATH.read_text())
MTP = SpeculativeDecoding(method="mtp", num_speculative_tokens=3)
# A constructed 3-layer dense model with two DeepSeek-style next-token layers (num_nextn_predict_layers): per
# layer attention 1,024 × 128 × (16 + 16) = 4,194,304 and MLP 3 × 1,024 × 4,096 = 12,582,912, 16,777,216 in all.
NEXTN = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 1024,
         "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096,
         "vocab_size": 32000, "tie_word_embeddings": False, "num_nextn_predict_layers": 2}


def _waterfall(config: dict[str, Any], checkpoint: tuple[int, str] | None = None, **extra: Any) -> Waterfall:
    launch = EngineLaunch(max_model_len=32768, engine_version="0.25.1", **extra)
    return plan_waterfall(config, FITTED_CONSTANTS, launch, total_bytes=80 * GiB, total_source="test",
                          checkpoint=checkpoint)


def test_an_mtp_layer_is_one_full_attention_decoder_layer_of_the_targets_layout() -> None:
    # Qwen3.6-35B-A3B (2,048 wide): full attention 2,048 × 256 × (2 × 16 + 2 × 2) = 18,874,368, plus the output
    # gate q_proj yields, 2,048 × 16 × 256 = 8,388,608: 27,262,976. MoE: 256 experts and one shared expert of
    # 512, 3 × 2,048 × (512 × 256 + 512) = 808,452,096, the router 2,048 × 256 = 524,288 and the shared expert's
    # gate 2,048: 808,978,432. The layer: 836,241,408.
    assert full_attention_layer_params(QWEN36_35B) == 836_241_408
    # without layer_types the hybrid's layers follow full_attention_interval 4; the appended one is still full
    text = {key: value for key, value in QWEN36_35B["text_config"].items() if key != "layer_types"}
    assert full_attention_layer_params({**QWEN36_35B, "text_config": text}) == 836_241_408


def test_qwens_mtp_drafter_is_its_layer_and_one_fc_split_over_tp_in_the_model_dtype() -> None:
    size = model_size(QWEN36_35B)
    # mtp_num_hidden_layers 1: 836,241,408 + the fc 2 × 2,048 × 2,048 = 8,388,608 → 844,630,016 parameters,
    # at 2 B 1,689,260,032 B; over TP 2 every part is split: 844,630,016 B.
    term = drafter_weights_term(QWEN36_35B, size, MTP, 2, 1, 1, in_checkpoint=False)
    assert term is not None and term.subtracted
    assert term.bytes == 1_689_260_032
    assert "in 2 B each whatever the checkpoint's format" in term.source
    tp2 = drafter_weights_term(QWEN36_35B, size, MTP, 2, 2, 1, in_checkpoint=False)
    assert tp2 is not None and tp2.bytes == 844_630_016


def test_the_drafter_weights_come_off_the_kv_memory_and_an_eagle_head_is_said_not_counted() -> None:
    plain, mtp = _waterfall(QWEN36_35B, quantization="fp8"), _waterfall(QWEN36_35B, quantization="fp8",
                                                                        speculative=MTP)
    # an FP8 checkpoint's MTP layer is priced at 2 B all the same: the 1,689,260,032 B above
    assert [t.name for t in mtp.terms] == ["weights", "drafter_weights", "activation_peak", "non_torch", "cuda_graphs"]
    assert plain.kv_bytes - mtp.kv_bytes == 1_689_260_032
    eagle = _waterfall(QWEN36_35B, speculative=SpeculativeDecoding(method="eagle3", num_speculative_tokens=3))
    assert "drafter_weights" not in [t.name for t in eagle.terms]
    assert any("eagle3 drafter" in note and "not counted" in note for note in eagle.assumptions)
    ngram = _waterfall(QWEN36_35B, speculative=SpeculativeDecoding(method="ngram", num_speculative_tokens=3))
    assert ngram.kv_bytes == _waterfall(QWEN36_35B).kv_bytes and ngram.assumptions == _waterfall(QWEN36_35B).assumptions


def test_nextn_layers_hold_an_eh_proj_each_whole_and_with_pipeline_stages_their_own_embedding() -> None:
    size = model_size(NEXTN)
    # TP 2 × PP 2: two layers split over TP, 2 × 16,777,216 / 2 = 16,777,216; an eh_proj each, 2 × 1,024 × 1,024
    # = 2,097,152, whole: 4,194,304; the last stage's own input embedding 32,000 × 1,024 / 2 = 16,384,000.
    # 37,355,520 parameters at 2 B: 74,711,040 B.
    term = drafter_weights_term(NEXTN, size, MTP, 2, 2, 2, in_checkpoint=False)
    assert term is not None and term.bytes == 74_711_040
    # one stage shares the target's embedding: (16,777,216 + 4,194,304) × 2 = 41,943,040 B
    one_stage = drafter_weights_term(NEXTN, size, MTP, 2, 2, 1, in_checkpoint=False)
    assert one_stage is not None and one_stage.bytes == 41_943_040


def test_only_the_last_pipeline_stage_holds_the_drafter() -> None:
    plain = _waterfall(NEXTN, tensor_parallel_size=2, pipeline_parallel_size=2)
    mtp = _waterfall(NEXTN, tensor_parallel_size=2, pipeline_parallel_size=2, speculative=MTP)
    # the 74,711,040 B above come off the even split and off the last stage; the first stage keeps its memory
    assert plain.kv_bytes - mtp.kv_bytes == 74_711_040
    assert mtp.stage_kv_bytes == [plain.stage_kv_bytes[0], plain.stage_kv_bytes[1] - 74_711_040]


def test_a_checkpoints_own_size_already_holds_its_mtp_tensors() -> None:
    checkpoint = (70 * 10**9, "model.safetensors.index.json metadata.total_size")
    plain, mtp = _waterfall(QWEN36_35B, checkpoint=checkpoint), _waterfall(QWEN36_35B, checkpoint=checkpoint,
                                                                           speculative=MTP)
    drafter = next(t for t in mtp.terms if t.name == "drafter_weights")
    assert not drafter.subtracted and "already in the checkpoint's own size" in drafter.source
    assert mtp.kv_bytes == plain.kv_bytes


def test_mtp_without_mtp_layers_in_the_config_is_refused() -> None:
    config = {key: value for key, value in NEXTN.items() if key != "num_nextn_predict_layers"}
    with pytest.raises(HarnessError, match="no mtp_num_hidden_layers or num_nextn_predict_layers"):
        _waterfall(config, speculative=MTP)


def test_harness_budget_gpu_takes_the_drafter_weights_off_before_the_cache() -> None:
    shape = load_model_shape(str(QWEN36_PATH))
    launch = EngineLaunch(max_model_len=32768, engine_version="0.25.1", tensor_parallel_size=2)
    plain = answer_fit(shape, launch, gpu="80", asked_tokens=None)
    mtp = answer_fit(shape, launch.model_copy(update={"speculative": MTP}), gpu="80", asked_tokens=None)
    # over TP 2 the drafter holds 844,630,016 B a GPU (above)
    assert plain.waterfall.kv_bytes - mtp.waterfall.kv_bytes == 844_630_016
