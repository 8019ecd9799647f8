"""The weights term's parameter counts beyond a text decoder: vision towers and Qwen-style shared experts.

Config fields come from public copies: Qwen2.5-VL-7B's vision tower from the module print-out in
https://github.com/acproject/duorou/blob/11191b4f9dd928d67dcb3911a181c89024e2e256/docs/qwen2.5vl_graph.md
(Conv3d(3, 1280, kernel (2, 14, 14)), 32 blocks, qkv 1280 → 3840, MLP 1280 → 3420, merger 5120 → 5120 → 3584),
its decoder from tests/fixtures/field/configs/Qwen--Qwen2.5-7B-Instruct.json (the same 3,584-wide, 28-layer
Qwen2.5 decoder); LLaVA-1.5-7B's from the copy of its hub config in
https://github.com/tung2kg1/AI-Stock-Chart-Analysis/blob/61f63b568cf2def9b3e13740ee072bf3b48dac8a/llava-1.5-7b-hf/config.json,
whose text_config leaves the decoder's widths at transformers' LlamaConfig defaults (4,096 hidden, 11,008
intermediate, 32 layers, 32 heads: src/transformers/models/llama/configuration_llama.py at
008e574391258935f3ecc3035c882e73bbcac419); Qwen1.5-MoE-A2.7B's from transformers' Qwen2MoeConfig
defaults, documented as that checkpoint's (src/transformers/models/qwen2_moe/configuration_qwen2_moe.py at
008e574391258935f3ecc3035c882e73bbcac419); Gemma 3 12B's from the Hugging Face config MaxText writes for it
(https://github.com/AI-Hypercomputer/maxtext/blob/02b47fd815659b2d3119206cb25c05b5a0a74dbc/src/MaxText/utils/ckpt_conversion/utils/hf_model_configs.py
`gemma3_12b_config`); Qwen2.5-VL-72B's from torchtune's builder for it
(https://github.com/pytorch/torchtune/blob/49698b248e5ac5fe4a5e46950a2bf9bb05caee9c/torchtune/models/qwen2_5_vision/_model_builders.py
`qwen2_5_vl_72b`); Qwen3-VL-30B-A3B's from tests/fixtures/field/configs (that folder's README names its copy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from harness.errors import HarnessError
from harness.predict.allocator import MiB, block_slack_bytes
from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.engine_launch import EngineLaunch
from harness.predict.memory_model import FITTED_CONSTANTS, plan_waterfall
from harness.predict.parameter_count import model_size
from harness.predict.term import Term
from harness.predict.vision_tower import vision_tower
from harness.predict.weight_formats import weight_format
from harness.predict.weights import weights_term, with_allocator_slack
from harness.units import GiB

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"
QWEN25_VL_7B_VISION = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "out_hidden_size": 3584,
                       "patch_size": 14, "temporal_patch_size": 2, "in_chans": 3, "spatial_merge_size": 2,
                       "num_heads": 16}
LLAVA_15_7B: dict[str, Any] = {
    "architectures": ["LlavaForConditionalGeneration"], "tie_word_embeddings": False, "vision_feature_layer": -2,
    "text_config": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "vocab_size": 32064},
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096, "num_attention_heads": 16,
                      "model_type": "clip_vision_model", "num_hidden_layers": 24, "patch_size": 14},
}
QWEN25_VL_72B = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "hidden_size": 8192,
                 "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "intermediate_size": 29568, "vocab_size": 152064, "tie_word_embeddings": False,
                 "vision_config": {**QWEN25_VL_7B_VISION, "intermediate_size": 3456, "out_hidden_size": 8192}}
GEMMA3_12B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "num_hidden_layers": 48, "head_dim": 256,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 262144},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "num_attention_heads": 16,
                      "model_type": "siglip_vision_model", "num_channels": 3, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}
QWEN15_MOE_A27B = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
                   "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "vocab_size": 151936, "tie_word_embeddings": False, "num_experts": 60, "num_experts_per_tok": 4,
                   "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}


def _qwen25_vl_7b() -> dict[str, Any]:
    text = json.loads((CONFIGS / "Qwen--Qwen2.5-7B-Instruct.json").read_text())
    return {**text, "architectures": ["Qwen2_5_VLForConditionalGeneration"], "vision_config": QWEN25_VL_7B_VISION}


def test_qwen25_vl_7b_vision_tower_by_hand() -> None:
    # Patch embedding (held whole): 3 channels × 2 frames × 14 × 14 × 1,280 = 1,505,280.
    # A block: qkv 1,280 × 3,840 + 3,840 bias = 4,919,040 and gate_up 1,280 × 6,840 + 6,840 = 8,762,040
    # (column-parallel, bias split); proj 1,280 × 1,280 = 1,638,400 and down 3,420 × 1,280 = 4,377,600
    # (row-parallel) with their 1,280-wide biases whole; two RMSNorms 2 × 1,280. Split 19,697,080, whole
    # 5,120; × 32 blocks: 630,306,560 and 163,840.
    # Merger: ln_q 1,280 (whole); 5,120 × 5,120 + 5,120 = 26,219,520 (column); 5,120 × 3,584 = 18,350,080
    # (row) + 3,584 bias (whole). Split 630,306,560 + 26,219,520 + 18,350,080 = 674,876,160; whole
    # 1,505,280 + 163,840 + 1,280 + 3,584 = 1,673,984; together 676,550,144.
    tower = vision_tower(_qwen25_vl_7b())
    assert tower is not None
    assert (tower.split_params, tower.whole_params) == (674_876_160, 1_673_984)
    # TP=2 in bf16: (674,876,160 / 2 + 1,673,984) × 2 B = 339,112,064 × 2 = 678,224,128 B a GPU.
    assert tower.bytes_per_gpu(2, 2) == 678_224_128


def test_qwen25_vl_7b_weights_hold_the_tower_beside_the_decoder() -> None:
    # Decoder: attention 3,584 × 128 × (2·28 + 2·4) = 29,360,128 and MLP 3 × 3,584 × 18,944 = 203,685,888
    # per layer, × 28 = 6,525,288,448; embeddings 2 × 152,064 × 3,584 = 1,089,994,752; 7,615,283,200
    # parameters, 15,230,566,400 B. Tower 676,550,144 × 2 B = 1,353,100,288. Sum 16,583,666,688 B =
    # 15.445 GiB, 1.2% under the 15.6271 GiB v082-qwen25-vl-7b-h100-len128000 logs (14.185 GiB, 9.2%
    # under, without the tower).
    weights = weights_term(model_size(_qwen25_vl_7b()), 2, None, 1)
    assert weights.bytes == 16_583_666_688
    assert abs(weights.bytes / GiB - 15.6271) / 15.6271 < 0.02
    assert "Qwen2.5-VL vision transformer's 676,550,144 parameters" in weights.source
    # TP=2: half the decoder, 7,615,283,200 B, beside the tower's 678,224,128 B a GPU = 8,293,507,328.
    # PP=2: every stage builds the tower whole: 7,615,283,200 + 1,353,100,288 = 8,968,383,488.
    assert weights_term(model_size(_qwen25_vl_7b()), 2, None, 2).bytes == 8_293_507_328
    assert weights_term(model_size(_qwen25_vl_7b()), 2, None, 1, 2).bytes == 8_968_383_488


def test_qwen25_vl_72b_tower_splits_over_tp_as_its_log_says() -> None:
    # Tower: blocks as the 7B's with a 3,456-wide MLP: qkv 4,919,040 + proj 1,638,400 + gate_up
    # 1,280 × 6,912 + 6,912 = 8,854,272 + down 3,456 × 1,280 = 4,423,680, split 19,835,392 a block, × 32 =
    # 634,732,544; merger 26,219,520 + 5,120 × 8,192 = 41,943,040: split 702,895,104. Whole: 1,505,280
    # patch + 32 × 5,120 + 1,280 + 8,192 = 1,678,592. TP=4: (702,895,104 / 4 + 1,678,592) × 2 B = 354,804,736.
    # Decoder: (8,192 × 128 × (2·64 + 2·8) = 150,994,944 + 3 × 8,192 × 29,568 = 726,663,168) × 80 =
    # 70,212,648,960, embeddings 2 × 152,064 × 8,192 = 2,491,416,576; × 2 B / 4 = 36,352,032,768.
    # Sum 36,706,837,504 B = 34.19 GiB, 0.7% under the 34.4340 GiB each of v083-qwen25-vl-72b-a100-40gb-tp4's
    # four workers logs; a tower held whole on each GPU (1,409,147,392 B) would put it 2.1% over.
    weights = weights_term(model_size(QWEN25_VL_72B), 2, None, 4)
    assert weights.bytes == 36_706_837_504
    assert abs(weights.bytes / GiB - 34.4340) / 34.4340 < 0.01


def test_qwen3_vl_tower_by_hand_with_its_deepstack_mergers() -> None:
    # Qwen3-VL-30B-A3B (tests/fixtures/field/configs): width 1,152, MLP 4,304, 27 blocks, merged 4 × 1,152 = 4,608.
    # A block: qkv 1,152 × 3,456 + 3,456 = 3,984,768 and fc1 1,152 × 4,304 + 4,304 = 4,962,512 (column, bias
    # split); proj 1,152 × 1,152 = 1,327,104 and fc2 4,304 × 1,152 = 4,958,208 (row) with their 1,152 biases
    # whole; two LayerNorms 4 × 1,152. Split 15,232,592, whole 6,912; × 27: 411,279,984 and 186,624.
    # Merger: fc1 4,608 × 4,608 + 4,608 = 21,238,272, fc2 4,608 × 2,048 = 9,437,184 (+ 2,048 whole), split
    # 30,675,456; its LayerNorm over 1,152 (2,304 whole), the three deepstack mergers' over 4,608 (9,216 each).
    # Embeddings whole: Conv3d 3 × 2 × 16 × 16 × 1,152 + 1,152 bias = 1,770,624, positions 2,304 × 1,152 =
    # 2,654,208. Split 411,279,984 + 4 × 30,675,456 = 533,981,808; whole 186,624 + 4,352 + 3 × 11,264 +
    # 4,424,832 = 4,649,600.
    config = json.loads((CONFIGS / "Qwen--Qwen3-VL-30B-A3B-Instruct.json").read_text())
    tower = vision_tower(config)
    assert tower is not None and tower.name == "Qwen3-VL vision transformer"
    assert (tower.split_params, tower.whole_params) == (533_981_808, 4_649_600)
    # TP=2 in bf16: (533,981,808 / 2 + 4,649,600) × 2 B = 543,281,008 B a GPU.
    assert tower.bytes_per_gpu(2, 2) == 543_281_008


def test_qwen36_builds_qwen3_vl_s_tower_unless_the_launch_serves_no_image_or_video() -> None:
    # Qwen3.6-27B (Qwen3_5ForConditionalGeneration) builds qwen3_vl.py's tower: the Qwen3-VL blocks above, split
    # 411,279,984 and whole 186,624; no deepstack mergers; its merger's fc2 maps 4,608 to the decoder's 5,120:
    # 4,608 × 5,120 = 23,592,960 split, 5,120 bias whole, beside fc1's 21,238,272 and the LayerNorm's 2,304.
    # Split 411,279,984 + 44,831,232 = 456,111,216; whole 186,624 + 7,424 + 4,424,832 embeddings = 4,618,880.
    config = json.loads((CONFIGS / "Qwen--Qwen3.6-27B.json").read_text())
    tower = vision_tower(config)
    assert tower is not None and tower.name == "Qwen3-VL vision transformer"
    assert (tower.split_params, tower.whole_params) == (456_111_216, 4_618_880)
    # TP=2 in bf16: (456,111,216 / 2 + 4,618,880) × 2 B = 465,348,976 B on each GPU, unless image and video both
    # have a limit of 0 (--language-model-only), where from 0.10.2 vLLM does not build it.
    def weights(version: str, **encoder: Any) -> int:
        launch = EngineLaunch(engine_version=version, max_model_len=4096, tensor_parallel_size=2,
                              encoder=EncoderLaunch(**encoder))
        return next(t.bytes for t in plan_waterfall(config, FITTED_CONSTANTS, launch, total_bytes=80 * GiB,
                                                    total_source="test").terms if t.name == "weights")
    built = weights("0.22.0")
    assert built - weights("0.22.0", language_model_only=True) == 465_348_976
    assert built - weights("0.22.0", image_limit=0, video_limit=0) == 465_348_976
    assert weights("0.22.0", image_limit=0) == built  # video still served
    assert EncoderLaunch(language_model_only=True).builds_tower(Version("0.10.1"))  # not read before 0.10.2


def test_llava_tower_stops_at_the_feature_layer_and_stays_16_bit_under_awq() -> None:
    # vision_feature_layer −2 of 24: llava.py builds 24 − 2 + 1 = 23 CLIP layers and no post-LayerNorm.
    # Embeddings (whole): class 1,024 + patch conv 3 × 14 × 14 × 1,024 = 602,112 + (576 + 1) × 1,024
    # positions = 590,848 + pre-LayerNorm 2,048 = 1,196,032.
    # A layer: qkv 1,024 × 3,072 + 3,072 = 3,148,800 and fc1 1,024 × 4,096 + 4,096 = 4,198,400 (column);
    # out 1,024 × 1,024 = 1,048,576 and fc2 4,096 × 1,024 = 4,194,304 (row) + two 1,024 biases and two
    # LayerNorms 4,096 (whole). Split 12,590,080, whole 6,144; × 23: 289,571,840 and 141,312.
    # Projector: 1,024 × 4,096 + 4,096 = 4,198,400 (column), 4,096 × 4,096 = 16,777,216 (row) + 4,096.
    # Split 310,547,456; whole 1,196,032 + 141,312 + 4,096 = 1,341,440; together 311,888,896.
    size = model_size(LLAVA_15_7B)
    assert size.vision is not None
    assert (size.vision.split_params, size.vision.whole_params) == (310_547_456, 1_341_440)
    # AWQ: decoder linears 32 × (4,096 × 128 × 128 + 3 × 4,096 × 11,008) = 6,476,005,376 at 4 + 20 / 128 =
    # 4.15625 bits = 3,364,487,168 B; embeddings 2 × 32,064 × 4,096 × 2 B = 525,336,576; tower 311,888,896 × 2 B =
    # 623,777,792. Sum 4,513,601,536 B = 4.204 GiB, 1.2% under the 4.2530 GiB v0102-llava15-7b-awq-16gib
    # logs; a 4-bit tower (3.774 GiB) would put it 11% under.
    weights = weights_term(size, 2, weight_format("awq", LLAVA_15_7B, size), 1)
    assert weights.bytes == 4_513_601_536
    assert "CLIP vision tower" in weights.source


def test_gemma3_siglip_tower_is_what_the_vision_preset_adds_to_the_text_one() -> None:
    # SigLIP, all 27 layers. Embeddings (whole): patch conv 3 × 14 × 14 × 1,152 = 677,376 + 1,152 bias +
    # (896 / 14)² = 4,096 positions × 1,152 = 4,718,592: 5,397,120.
    # A layer: qkv 1,152 × 3,456 + 3,456 = 3,984,768 and fc1 1,152 × 4,304 + 4,304 = 4,962,512 (column);
    # out 1,152 × 1,152 = 1,327,104 and fc2 4,304 × 1,152 = 4,958,208 (row) + two 1,152 biases and two
    # LayerNorms 4,608 (whole). Split 15,232,592, whole 6,912; × 27: 411,279,984 and 186,624.
    # post_layernorm 2,304; no head (vision_use_head false); projector 1,152 × 3,840 + 1,152 RMSNorm =
    # 4,424,832, whole. Whole 5,397,120 + 186,624 + 2,304 + 4,424,832 = 10,010,880; together 421,290,864,
    # exactly what keras-hub's vision+text Gemma 3 12B preset adds to its text-only one: 12,187,079,280 −
    # 11,765,788,416 (https://github.com/keras-team/keras-hub/blob/00d9f10a8e74d4f552ed50170b7dcadb65d3bd52/keras_hub/src/models/gemma3/gemma3_presets.py).
    tower = vision_tower(GEMMA3_12B)
    assert tower is not None
    assert (tower.split_params, tower.whole_params) == (411_279_984, 10_010_880)


def test_qwen2_moe_counts_its_shared_expert_and_its_gate() -> None:
    # Qwen1.5-MoE-A2.7B, per layer: attention 2,048 × 128 × (2·16 + 2·16) = 16,777,216; routed experts
    # 3 × 2,048 × 1,408 × 60 = 519,045,120; the shared expert 3 × 2,048 × 5,632 = 34,603,008; router
    # 2,048 × 60 = 122,880 and the shared expert's gate 2,048 × 1 = 2,048. 570,550,272 × 24 layers =
    # 13,693,206,528; embeddings 2 × 151,936 × 2,048 = 622,329,856. Total 14,315,536,384, the model card's
    # "14.3B parameters in total" (its README as copied in
    # https://github.com/ZHUI/paddlenlp_model_readme/blob/ffc26950e6a9f69fb01d7c9b64607770d729e56b/qwen/qwen1.5-moe-a2.7b/index.md).
    size = model_size(QWEN15_MOE_A27B)
    assert size.linear_params + size.embedding_params == 14_315_536_384
    assert (size.shared_experts, size.shared_width) == (1, 5632)


def test_deepseek_shared_experts_are_n_shared_times_the_expert_width() -> None:
    # DeepSeek-V2-Lite: n_shared_experts 2 × moe_intermediate_size 1,408 = 2,816 wide, no gate.
    size = model_size(json.loads((CONFIGS / "deepseek-ai--DeepSeek-V2-Lite.json").read_text()))
    assert (size.shared_experts, size.shared_width) == (2, 2816)


def test_a_text_only_config_has_no_tower() -> None:
    assert model_size(json.loads((CONFIGS / "Qwen--Qwen2.5-7B-Instruct.json").read_text())).vision is None


def test_a_vision_config_missing_a_field_is_named() -> None:
    config = {**_qwen25_vl_7b(), "vision_config": {**QWEN25_VL_7B_VISION, "depth": None}}
    with pytest.raises(HarnessError, match=r"field 'vision_config\.depth'"):
        model_size(config)
    unknown = {**LLAVA_15_7B, "vision_config": {**LLAVA_15_7B["vision_config"], "model_type": "mystery"}}
    with pytest.raises(HarnessError, match=r"vision_config\.model_type 'mystery'"):
        model_size(unknown)
    with pytest.raises(HarnessError, match="field 'vision_feature_layer'"):
        model_size({**LLAVA_15_7B, "vision_feature_layer": "last"})


def test_a_gated_delta_net_hybrid_counts_its_linear_layers_and_its_gated_attention() -> None:
    # Qwen3.6-35B-A3B (tests/fixtures/field/configs): 40 layers, every 4th full attention, so 30 linear and 10 full.
    config = json.loads((CONFIGS / "Qwen--Qwen3.6-35B-A3B.json").read_text())
    size = model_size(config)
    # Full attention, hidden 2,048, 16 heads and 2 KV heads of 256: 2,048 × 256 × (2 × 16 + 2 × 2) = 18,874,368,
    # and the output gate q_proj also yields, 2,048 × 16 × 256 = 8,388,608: 27,262,976 a layer, 272,629,760 for 10.
    # Gated delta net, key_dim 16 × 128 = 2,048 and value_dim 32 × 128 = 4,096: in_proj_qkvz 2,048 × 12,288 =
    # 25,165,824, in_proj_ba 2,048 × 64 = 131,072, conv1d 8,192 × 4 = 32,768, A_log and dt_bias 64, norm 128,
    # out_proj 4,096 × 2,048 = 8,388,608: 33,718,464 a layer, 1,011,553,920 for 30.
    # MoE, 256 experts of 512 and one shared expert of 512: 3 × 2,048 × (256 × 512 + 512) = 808,452,096, the router
    # 2,048 × 256 = 524,288 and the shared gate 2,048: 808,978,432 a layer, 32,359,137,280 for 40.
    assert size.linear_params == 272_629_760 + 1_011_553_920 + 32_359_137_280
    assert size.embedding_params == 2 * 248_320 * 2_048  # untied: 1,017,118,720


def test_routers_are_whole_on_every_tensor_parallel_rank() -> None:
    # Qwen1.5-MoE-A2.7B (above): the routers and shared-expert gates, 24 × (122,880 + 2,048) = 2,998,272, are
    # ReplicatedLinear. TP=4, bf16: the other linears (13,693,206,528 − 2,998,272) / 4 = 3,422,552,064, the
    # routers whole, embeddings 622,329,856 / 4 = 155,582,464; 3,581,132,800 parameters × 2 B = 7,162,265,600.
    size = model_size(QWEN15_MOE_A27B)
    assert size.router_params == 2_998_272
    weights = weights_term(size, 2, None, 4)
    assert weights.bytes == 7_162_265_600
    # Beyond a quarter of every linear: the routers' other three quarters, 2,248,704.
    assert "each rank holding 2,248,704 parameters more than its share (the routers: not split)" in weights.source


def test_kv_heads_are_replicated_when_there_are_more_ranks_than_heads() -> None:
    # Qwen2.5-7B, 4 KV heads of 128 over 3,584: per layer q and o 2 × 3,584 × 28 × 128 = 25,690,112, k and v
    # 2 × 3,584 × 4 × 128 = 3,670,016. TP=4 splits both: 29,360,128 / 4 × 28 layers = 205,520,896. TP=8 holds
    # one K and one V head a rank: (25,690,112 / 8 + 3,670,016 / 4) × 28 = (3,211,264 + 917,504) × 28 = 115,605,504.
    size = model_size(json.loads((CONFIGS / "Qwen--Qwen2.5-7B-Instruct.json").read_text()))
    assert size.rank_params_by_kind(4)["mixer"] == 205_520_896
    assert size.rank_params_by_kind(8)["mixer"] == 115_605_504
    # Beyond an eighth: (3,670,016 / 4 − 3,670,016 / 8) × 28 = 12,845,056; none at TP=4.
    assert "12,845,056 parameters more than its share (K/V heads (fewer than the ranks)" in weights_term(
        size, 2, None, 8).source
    assert "more than its share" not in weights_term(size, 2, None, 4).source


def test_mla_down_projections_are_whole_on_every_rank() -> None:
    # DeepSeek-V2-Lite (no q_lora_rank), per layer: q 2,048 × 16 × 192 = 6,291,456, kv_a_proj_with_mqa
    # 2,048 × (512 + 64) = 1,179,648 (a ReplicatedLinear), kv_b 512 × 16 × 256 = 2,097,152, o 2,048 × 2,048 =
    # 4,194,304; 13,762,560. TP=2: (13,762,560 − 1,179,648) / 2 + 1,179,648 = 7,471,104 × 27 layers =
    # 201,719,808. Its 26 MoE layers' routers, 2,048 × 64 each = 3,407,872, are whole too.
    size = model_size(json.loads((CONFIGS / "deepseek-ai--DeepSeek-V2-Lite.json").read_text()))
    on_rank = size.rank_params_by_kind(2)
    assert on_rank["mixer"] == 201_719_808
    assert on_rank["router"] == 3_407_872


def test_the_allocator_counts_a_large_blocks_slack_only_when_too_little_is_left_to_split() -> None:
    # Past 10 MiB a tensor gets a segment of its own rounded up to 2 MiB; the rest is split off only when more
    # than 1 MiB is left. 31.5 MiB: a 32 MiB segment, 0.5 MiB kept. 24.5 MiB: 26 MiB, 1.5 MiB split off. 129 MiB,
    # an odd count: 130 MiB, 1 MiB kept (not more than 1 MiB). 5 MiB shares a 20 MiB segment, split to 512 B;
    # 1,000 B rounds up to 1,024.
    assert block_slack_bytes(63 * MiB // 2) == MiB // 2
    assert block_slack_bytes(49 * MiB // 2) == 0
    assert block_slack_bytes(129 * MiB) == MiB
    assert block_slack_bytes(5 * MiB) == 0 and block_slack_bytes(1000) == 24


def test_qwen2_7b_weights_carry_the_allocators_slack_its_logs_load() -> None:
    # Qwen2-7B, TP=1, per layer: QKV (3,584 + 2 × 512) × 3,584 × 2 B = 31.5 MiB (0.5 kept), o_proj 24.5 MiB (split),
    # gate_up 259 MiB (1 kept), down 129.5 MiB (0.5 kept): 2 MiB × 28 layers; the embedding and the output layer,
    # 152,064 × 3,584 × 2 B = 1,039.5 MiB each (0.5 kept): 57 MiB, against the 57.8 MiB its two 0.10.1.1 logs
    # load beyond the parameters and the RoPE cache. TP=2: QKV 15.75 MiB (0.25 kept), o_proj 12.25 (split), gate_up
    # 129.5 (0.5), down 64.75 (split): 0.75 × 28, and 519.75 MiB halves of the vocabulary (0.25 each): 21.5 MiB,
    # against the 22.1 MiB of its three TP=2 logs.
    size = model_size(json.loads((CONFIGS / "Qwen--Qwen2-7B-Instruct.json").read_text()))
    bare = Term(name="weights", bytes=0, subtracted=True, source="parameters")
    assert with_allocator_slack(bare, size, 2, 1).bytes == 57 * MiB
    assert with_allocator_slack(bare, size, 2, 2).bytes == 43 * MiB // 2
    assert "57.0 MiB the CUDA caching allocator rounds" in with_allocator_slack(bare, size, 2, 1).source
