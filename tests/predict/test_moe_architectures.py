"""Mixture-of-experts families vLLM serves whose KV layout or weights the calculator would misstate: refused by name.

HunYuan-MoE, as vLLM's hunyuan_v1.py builds it (read at 00f8d4456f506c4885a122c993796a6abc319af8): with
`use_cla`, a layer whose index is not a multiple of `cla_share_factor` is a `HunYuanCrossAttention` that keeps
no K/V of its own and attends over the previous layer's, and the shared expert (`use_mixed_mlp_moe`) is one MLP of
`intermediate_size * num_shared_expert`, a field the shared-expert count does not read.
"""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.predict.model_shape import parse_config


def test_hunyuan_moe_is_refused_for_its_cross_layer_kv_sharing() -> None:
    config = {"architectures": ["HunYuanMoEV1ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
              "num_attention_heads": 32, "vocab_size": 128000}
    with pytest.raises(HarnessError, match=r"HunYuanMoEV1ForCausalLM is refused: .*cross-layer attention"):
        parse_config(config, source="config.json")
