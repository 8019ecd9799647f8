"""Attention layers that keep a cache other than the config's headline heads give them (Gemma 4).

Gemma 4's full-attention layers have a head size of their own, `global_head_dim`, and where the config sets
`attention_k_eq_v` (K reused as V) their own K/V head count, `num_global_key_value_heads`; the cache still holds a
K and a V for each such head. The sliding layers keep `head_dim` and `num_key_value_heads` (gemma4.py
`Gemma4DecoderLayer`, read in vLLM 0.19.0 to 0.34.0). The last `num_kv_shared_layers` layers read an earlier
layer's cache and keep none of their own: vLLM gives them no KV cache spec (gpu_model_runner.py
`get_kv_cache_spec`, `kv_sharing_target_layer_name`).
"""

from __future__ import annotations

from typing import Any

from harness.errors import HarnessError
from harness.predict.config_counts import stated_count


def full_attention_heads(config: dict[str, Any], source: str, notes: list[str]) -> tuple[int, int] | None:
    """(K/V heads, head size) of a full-attention layer where the config gives those layers their own, else None."""
    head_dim = stated_count(config, "global_head_dim", source)
    global_heads = stated_count(config, "num_global_key_value_heads", source)
    k_eq_v = config.get("attention_k_eq_v")
    if k_eq_v is not None and not isinstance(k_eq_v, bool):
        raise HarnessError(f"{source}: field 'attention_k_eq_v' must be true or false, got {k_eq_v!r}")
    if head_dim is None and not (k_eq_v and global_heads):
        return None
    kv_heads = global_heads if k_eq_v and global_heads else stated_count(config, "num_key_value_heads", source)
    if kv_heads is None:
        raise HarnessError(f"{source}: field 'num_key_value_heads' is needed to size full-attention layers")
    head_dim = head_dim or stated_count(config, "head_dim", source)
    if head_dim is None:
        raise HarnessError(f"{source}: field 'head_dim' is needed to size full-attention layers")
    notes.append(f"full-attention layers keep {kv_heads} K/V heads of {head_dim}"
                 + (" (attention_k_eq_v: num_global_key_value_heads)" if k_eq_v and global_heads else "")
                 + (" (global_head_dim)" if config.get("global_head_dim") else ""))
    return kv_heads, head_dim


def kv_shared_layers(config: dict[str, Any], num_layers: int, source: str, notes: list[str]) -> int:
    """How many of the last layers reuse an earlier layer's cache (0 where the config names none)."""
    shared = config.get("num_kv_shared_layers")
    if shared is None or shared == 0:
        return 0
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 < shared < num_layers:
        raise HarnessError(f"{source}: field 'num_kv_shared_layers' must be a whole number below num_hidden_layers "
                           f"({num_layers}), got {shared!r}")
    notes.append(f"the last {shared} layers reuse an earlier layer's KV cache (num_kv_shared_layers): no cache of "
                 "their own")
    return shared
