"""How many parameters a config.json describes, by part: what the weights and activation terms are sized from.

Attention (or MLA), dense or MoE MLP with its shared experts, embeddings, and a VL checkpoint's vision
tower (`vision_tower.py`), each counted as vLLM builds the layer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from harness.errors import HarnessError
from harness.predict.architectures import language_config, mlp_projections
from harness.predict.vision_tower import VisionTower, vision_tower


class ModelSize(BaseModel):
    """The widths and parameter counts the weights and activation terms need."""

    hidden: int
    vocab: int
    linear_params: int
    expert_params: int = 0  # the routed experts' share of linear_params
    embedding_params: int
    layers: int
    dense_width: int = 0  # intermediate_size of the dense MLP layers
    moe_layers: int = 0
    experts: int = 0  # routed experts per MoE layer
    expert_width: int = 0  # moe_intermediate_size
    top_k: int = 0  # routed experts per token
    shared_experts: int = 0
    shared_width: int = 0  # the shared experts' intermediate width together, per MoE layer
    vision: VisionTower | None = None  # a VL checkpoint's image encoder, beside the decoder counted above


def model_size(config: dict[str, Any], source: str = "config") -> ModelSize:
    """Parameter counts from a config.json: attention (or MLA), dense or MoE MLP, embeddings, vision tower."""
    vision = vision_tower(config, source)
    projections = mlp_projections(config)
    config = language_config(config)
    try:
        hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        heads = config["num_attention_heads"]
    except KeyError as missing:
        raise HarnessError(f"{source}: field {missing} is needed to size the weights") from None
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    if config.get("kv_lora_rank"):
        nope, rope, v_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
        q_lora = config.get("q_lora_rank")
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        attention = q + hidden * (config["kv_lora_rank"] + rope) + config["kv_lora_rank"] * heads * (nope + v_dim)
        attention += heads * v_dim * hidden
    else:
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    experts = config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts")
    dense_width = config.get("intermediate_size") or 4 * hidden
    if experts:
        expert_width = config.get("moe_intermediate_size") or dense_width
        shared, shared_width, shared_gate = _shared_experts(config, expert_width, hidden)
        dense_layers = config.get("first_k_dense_replace") or 0
        moe_mlp = 3 * hidden * (expert_width * experts + shared_width) + hidden * experts + shared_gate
        mlp = dense_layers * projections * hidden * dense_width + (layers - dense_layers) * moe_mlp
        routed = config.get("num_experts_per_tok") or config.get("experts_per_token") or 1
        expert_params = (layers - dense_layers) * 3 * hidden * expert_width * experts
    else:
        mlp = layers * projections * hidden * dense_width
        expert_width = expert_params = shared = shared_width = routed = dense_layers = 0
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return ModelSize(hidden=hidden, vocab=vocab, linear_params=layers * attention + mlp, expert_params=expert_params,
                     embedding_params=embeddings, layers=layers,
                     dense_width=dense_width if dense_layers or not experts else 0,
                     moe_layers=layers - dense_layers if experts else 0, experts=experts or 0,
                     expert_width=expert_width, top_k=routed, shared_experts=shared, shared_width=shared_width,
                     vision=vision)


def _shared_experts(config: dict[str, Any], expert_width: int, hidden: int) -> tuple[int, int, int]:
    """(shared experts, their width together, their gate's parameters) per MoE layer, in either config form.

    DeepSeek-V2/V3 write `n_shared_experts` experts of moe_intermediate_size, held as one MLP of their
    width together. Qwen2-MoE (and Qwen3-Next, whose config has the same field) writes one shared expert of
    `shared_expert_intermediate_size`, scaled by a sigmoid gate of one output (vLLM's qwen2_moe.py
    `Qwen2MoeSparseMoeBlock`: `shared_expert` and `shared_expert_gate = torch.nn.Linear(hidden_size, 1)`,
    read at 002fb90788ae749626fb09c6272f0cb604de46b6). Qwen3-MoE has none.
    """
    if config.get("shared_expert_intermediate_size"):
        return 1, config["shared_expert_intermediate_size"], hidden
    shared = config.get("n_shared_experts") or 0
    return shared, shared * expert_width, 0
