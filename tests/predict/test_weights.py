"""The weights term's parameter counts beyond a plain decoder: Qwen-style shared experts.

Qwen1.5-MoE-A2.7B's fields are transformers' Qwen2MoeConfig defaults, documented as that checkpoint's
(src/transformers/models/qwen2_moe/configuration_qwen2_moe.py at 008e574391258935f3ecc3035c882e73bbcac419).
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.predict.parameter_count import model_size

CONFIGS = Path(__file__).parents[1] / "fixtures" / "field" / "configs"
QWEN15_MOE_A27B = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 5632,
                   "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "vocab_size": 151936, "tie_word_embeddings": False, "num_experts": 60, "num_experts_per_tok": 4,
                   "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632}


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
