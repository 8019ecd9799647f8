"""How many parameters a config.json describes, by part: what the weights and activation terms are sized from.

Attention (or MLA), dense or MoE MLP with its shared experts, embeddings, and a VL checkpoint's vision
tower (`vision_tower.py`), each counted as vLLM builds the layer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from harness.errors import HarnessError
from harness.predict.architectures import check_counts, check_weights_counted, language_config, mlp_projections
from harness.predict.config_counts import needed_count
from harness.predict.vision_tower import VisionTower, vision_tower


class ModelSize(BaseModel):
    """The widths and parameter counts the weights and activation terms need."""

    hidden: int
    vocab: int
    linear_params: int
    mixer_params: int = 0  # attention (or MLA, or linear attention) projections: linear_params' first share
    dense_params: int = 0  # the dense MLP layers' share
    shared_params: int = 0  # the shared experts' share
    expert_params: int = 0  # the routed experts' share
    router_params: int = 0  # the MoE layers' routers and shared-expert gates: linear_params' last share
    whole_mixer_params: int = 0  # of mixer_params, the MLA down-projections (q_a, kv_a) every rank holds whole
    kv_projection_params: int = 0  # of mixer_params, the attention layers' K and V projections
    kv_heads: int = 0
    heads: int = 0
    head_dim: int = 0
    attention_layers: int = 0  # layers whose fused QKV projection is heads × head_dim (not MLA, not a hybrid's)
    gated_mlp: bool = True  # the dense MLP fuses gate and up projections (else one up projection)
    tied_embeddings: bool = False
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

    def rank_params_by_kind(self, tensor_parallel_size: int) -> dict[str, float]:
        """The linear parameters one tensor-parallel rank holds, by kind (weight_formats.CLASS_LINEARS' keys, and
        "router").

        vLLM splits every decoder linear over the ranks but two sorts. ReplicatedLinear ones are whole on every
        rank: the MoE routers and Qwen2-MoE's shared-expert gate (qwen3_moe.py, qwen2_moe.py, mixtral.py,
        deepseek_v2.py `gate`, gpt_oss.py `router`; the later GateLinear subclasses it) and MLA's
        down-projections (deepseek_v2.py `q_a_proj` and `kv_a_proj_with_mqa`, fused as `fused_qkv_a_proj` with
        `disable_tp=True`), read in 0.7.2, 0.8.5, 0.10.1.1, 0.13.0, 0.22.0 and 0.34.0. And each rank holds at
        least one K and one V head: QKVParallelLinear replicates them when there are more ranks than KV heads.
        """
        tp = tensor_parallel_size
        kv_shards = min(tp, self.kv_heads) if self.kv_heads else tp
        split_mixer = self.mixer_params - self.whole_mixer_params - self.kv_projection_params
        return {"mixer": split_mixer / tp + self.whole_mixer_params + self.kv_projection_params / kv_shards,
                "dense": self.dense_params / tp, "shared": self.shared_params / tp,
                "routed": self.expert_params / tp, "router": float(self.router_params)}


def model_size(config: dict[str, Any], source: str = "config") -> ModelSize:
    """Parameter counts from a config.json: attention (or MLA), dense or MoE MLP, embeddings, vision tower."""
    check_weights_counted(config, source)
    vision = vision_tower(config, source)
    projections = mlp_projections(config)
    config = language_config(config)
    check_counts(config, source)
    hidden, layers, vocab, heads = _needed(config, ("hidden_size", "num_hidden_layers", "vocab_size",
                                                    "num_attention_heads"), source)
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    if config.get("kv_lora_rank"):
        nope, rope, v_dim = _needed(config, ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), source)
        q_lora = config.get("q_lora_rank")
        q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
        attention = q + hidden * (config["kv_lora_rank"] + rope) + config["kv_lora_rank"] * heads * (nope + v_dim)
        attention += heads * v_dim * hidden
        whole_attention = hidden * (q_lora or 0) + hidden * (config["kv_lora_rank"] + rope)
        kv_projection = 0
    else:
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
        whole_attention, kv_projection = 0, 2 * hidden * head_dim * kv_heads
    linear_layers, linear_attention = _gated_delta_net(config, hidden, layers)
    if linear_layers and config.get("attn_output_gate", True):  # q_proj also yields the output gate
        attention += hidden * heads * head_dim
    mixers = (layers - linear_layers) * attention + linear_layers * linear_attention
    experts = config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts")
    dense_width = config.get("intermediate_size") or 4 * hidden
    if experts:
        expert_width = config.get("moe_intermediate_size") or dense_width
        shared, shared_width, shared_gate = _shared_experts(config, expert_width, hidden)
        dense_layers = config.get("first_k_dense_replace") or 0
        if dense_layers > layers:
            raise HarnessError(f"{source}: field 'first_k_dense_replace' is {dense_layers}, more dense layers than "
                               f"num_hidden_layers ({layers})")
        router = hidden * experts + shared_gate
        moe_mlp = 3 * hidden * (expert_width * experts + shared_width) + router
        mlp = dense_layers * projections * hidden * dense_width + (layers - dense_layers) * moe_mlp
        routed = config.get("num_experts_per_tok") or config.get("experts_per_token") or 1
        expert_params = (layers - dense_layers) * 3 * hidden * expert_width * experts
        dense_params = dense_layers * projections * hidden * dense_width
        shared_params = (layers - dense_layers) * 3 * hidden * shared_width
    else:
        mlp = dense_params = layers * projections * hidden * dense_width
        expert_width = expert_params = shared = shared_width = shared_params = routed = dense_layers = router = 0
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    attention_layers = layers - linear_layers
    mla = bool(config.get("kv_lora_rank"))
    return ModelSize(hidden=hidden, vocab=vocab, linear_params=mixers + mlp, mixer_params=mixers,
                     dense_params=dense_params, shared_params=shared_params, expert_params=expert_params,
                     router_params=(layers - dense_layers) * router,
                     whole_mixer_params=attention_layers * whole_attention,
                     kv_projection_params=attention_layers * kv_projection, kv_heads=kv_heads, heads=heads,
                     head_dim=head_dim, attention_layers=0 if mla or linear_layers else attention_layers,
                     gated_mlp=projections == 3,
                     tied_embeddings=bool(config.get("tie_word_embeddings")),
                     embedding_params=embeddings, layers=layers,
                     dense_width=dense_width if dense_layers or not experts else 0,
                     moe_layers=layers - dense_layers if experts else 0, experts=experts or 0,
                     expert_width=expert_width, top_k=routed, shared_experts=shared, shared_width=shared_width,
                     vision=vision)


def _gated_delta_net(config: dict[str, Any], hidden: int, layers: int) -> tuple[int, int]:
    """(linear-attention layers, parameters of each) of a Qwen3-Next / Qwen3.5 hybrid; (0, 0) for other models.

    vLLM's `Qwen3NextGatedDeltaNet` (qwen3_next.py): in_proj_qkvz (hidden → 2 × key_dim + 2 × value_dim),
    in_proj_ba (hidden → 2 × value heads), a depthwise conv1d over q, k and v, A_log and dt_bias per value head,
    a norm of one value head's width and out_proj (value_dim → hidden). Layers are linear where `layer_types`
    says so, else all but every `full_attention_interval`-th.
    """
    if "linear_key_head_dim" not in config:
        return 0, 0
    key_dim = config["linear_num_key_heads"] * config["linear_key_head_dim"]
    value_heads = config["linear_num_value_heads"]
    value_dim = value_heads * config["linear_value_head_dim"]
    per_layer = (hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * value_heads
                 + (2 * key_dim + value_dim) * config["linear_conv_kernel_dim"] + 2 * value_heads
                 + config["linear_value_head_dim"] + value_dim * hidden)
    if config.get("layer_types"):
        return sum(kind == "linear_attention" for kind in config["layer_types"]), per_layer
    return layers - layers // (config.get("full_attention_interval") or 4), per_layer


def _needed(config: dict[str, Any], fields: tuple[str, ...], source: str) -> list[int]:
    """The widths the weights cannot be sized without."""
    return [needed_count(config, field, source, "to size the weights") for field in fields]


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


def full_attention_layer_params(config: dict[str, Any], source: str = "config") -> int:
    """Linear parameters of one more decoder layer of the target's layout, with full attention: the block an MTP
    layer runs (Qwen3-Next's and Qwen3.5's `layer_type="full_attention"` decoder layer; DeepSeek's and GLM's
    decoder layer at index num_hidden_layers, past the dense `first_k_dense_replace` ones, so MoE where the
    model is). Counted as the difference a layer appended to the config makes, so every layout counted above
    (MLA, shared experts, the gated q_proj of a hybrid's full attention) is counted the same way here."""
    base = model_size(config, source).linear_params  # validates the fields the extension reads
    return model_size(_with_full_attention_layer(config), source).linear_params - base


def _with_full_attention_layer(config: dict[str, Any]) -> dict[str, Any]:
    """The config with one full-attention layer appended, in the dictionary that holds the layer count."""
    nested = config.get("text_config")
    in_nested = isinstance(nested, dict) and "num_hidden_layers" in nested
    inner = dict(nested if in_nested and isinstance(nested, dict) else config)
    layers = inner.get("num_hidden_layers")
    if not isinstance(layers, int):
        raise HarnessError("config: field 'num_hidden_layers' is needed to size the MTP layers")
    kinds = inner.get("layer_types")
    if not kinds and "linear_key_head_dim" in language_config(config):  # every interval-th layer full, as counted above
        interval = language_config(config).get("full_attention_interval") or 4
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    inner["num_hidden_layers"] = layers + 1
    if kinds:
        inner["layer_types"] = [*kinds, "full_attention"]
    return {**config, "text_config": inner} if in_nested else inner
