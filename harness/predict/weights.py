"""The waterfall's weights terms: the checkpoint's bytes on one GPU, and an MTP drafter's beside them.

Parameter counts come from the config (`parameter_count.py`); bits per stored weight from the checkpoint's
format (`weight_formats.py`).
"""

from __future__ import annotations

import math
from typing import Any

from harness.errors import HarnessError
from harness.predict.allocator import MiB, block_slack_bytes
from harness.predict.architectures import language_config
from harness.predict.kv_bytes import kv_heads_per_rank
from harness.predict.model_shape import mtp_layers
from harness.predict.mxfp4_layout import MARLIN, ExpertShape, Mxfp4Layout, describe, expert_layer_bytes
from harness.predict.parameter_count import ModelSize, full_attention_layer_params
from harness.predict.speculative import EAGLE_METHODS, SpeculativeDecoding
from harness.predict.term import Term
from harness.predict.weight_formats import EXPERTS_ONLY_FORMATS, WeightFormat
from harness.units import round_up

OWN_CHECKPOINT_DRAFTERS = EAGLE_METHODS | {"medusa"}  # drafters loaded from a checkpoint of their own


def weights_term(size: ModelSize, dtype_bytes: int, fmt: WeightFormat | None, tensor_parallel_size: int,
                 pipeline_parallel_size: int = 1, mxfp4: Mxfp4Layout = MARLIN) -> Term:
    """Checkpoint bytes one GPU holds: the kinds of linear the format quantizes in its bits, the rest in the dtype.

    A VL checkpoint's vision tower is held in the dtype, whatever the format. vLLM hands the tower its
    quantization config, but AWQ leaves unquantized every module the checkpoint names in
    `modules_to_not_convert` (awq.py and awq_marlin.py `get_quant_method`), where AWQ VL checkpoints name
    the tower (`["visual"]`): the tower stays 16-bit, as ModelOpt keeps every `visual` or `vision_tower`
    module (modelopt.py `get_quant_method`); a checkpoint that spares a kind of linear in some layers only is
    refused (weight_formats.py). GPTQ's per-module `dynamic` rules and an online `--quantization fp8` of a 16-bit
    checkpoint, which would quantize the tower too, are not modelled.

    MXFP4 experts are held as the MoE kernel the release picks on the GPU lays them out (`mxfp4_layout.py`:
    Marlin's unless `mxfp4` names Hopper's Triton or Blackwell's TRT-LLM kernel). Other formats
    store each kind of linear they quantize (attention, dense MLP, shared and routed experts; Kimi-K2-Thinking's
    int4 the routed experts alone) at their own widths; routers and gates stay 16-bit, as vLLM builds them
    without a quantization method. Routers, MLA's down-projections and K/V heads beyond one per rank are not
    split over tensor parallelism (`ModelSize.rank_params_by_kind`).
    """
    bits = fmt.bits if fmt else dtype_bytes * 8.0
    tp = tensor_parallel_size
    on_rank = size.rank_params_by_kind(tp)
    if fmt and fmt.method in EXPERTS_ONLY_FORMATS:
        experts = size.moe_layers * expert_layer_bytes(
            mxfp4, ExpertShape(size.experts, math.ceil(size.expert_width / tp), size.hidden))
        linear = experts + (sum(on_rank.values()) - on_rank["routed"]) * dtype_bytes
    else:
        stored = sum(params for kind, params in on_rank.items() if fmt and kind in fmt.quantized)
        linear = stored * bits / 8 + (sum(on_rank.values()) - stored) * dtype_bytes  # routers stay 16-bit
    total = (linear + size.embedding_params * dtype_bytes / tp) / pipeline_parallel_size
    described = (f"{fmt.method} ({bits:.4g} bits per weight of the {', '.join(fmt.quantized) or 'no'} linears, "
                 f"the rest {dtype_bytes} B; {fmt.source})" if fmt else f"{dtype_bytes} B per weight")
    if fmt and fmt.method in EXPERTS_ONLY_FORMATS:
        described += f", the experts {describe(mxfp4)}"
    source = (f"{size.linear_params + size.embedding_params:,} parameters from config.json, {described}, "
              f"split over {tensor_parallel_size * pipeline_parallel_size} GPU(s)")
    source += _unsplit_note(size, tp, on_rank)
    if size.vision is not None:
        total += size.vision.bytes_per_gpu(dtype_bytes, tp)
        source += (f"; plus the {size.vision.name}'s {size.vision.split_params + size.vision.whole_params:,} "
                   f"parameters in {dtype_bytes} B each, on every pipeline stage, its linears split over TP")
    return Term(name="weights", bytes=int(total), subtracted=True, source=source)


def with_allocator_slack(weights: Term, size: ModelSize, dtype_bytes: int, tensor_parallel_size: int,
                         pipeline_parallel_size: int = 1) -> Term:
    """The weights term with the caching allocator's slack over each large 16-bit weight one rank holds
    (allocator.py): the fused QKV and output projections, the MLP's (gate-)up and down projections, the experts'
    fused w13 and w2 (FusedMoE `create_weights`), the embedding and the output layer (their vocabulary padded to
    a multiple of 64, VocabParallelEmbedding), each shaped as vLLM builds it on the rank. MLA's, a hybrid's attention
    and a vision tower's weights are not among them; every stage is taken to hold its share of the layers."""
    tp, width = tensor_parallel_size, size.hidden
    layer_tensors: list[tuple[int, int]] = []  # (layers, elements of one tensor on the rank)
    if size.attention_layers:
        queries = size.heads // tp * size.head_dim
        keys = kv_heads_per_rank(size.kv_heads, tp) * size.head_dim
        layer_tensors += [(size.attention_layers, (queries + 2 * keys) * width),
                          (size.attention_layers, queries * width)]
    dense_layers = size.layers - size.moe_layers
    if size.dense_width and dense_layers:
        up = (2 if size.gated_mlp else 1) * size.dense_width // tp
        layer_tensors += [(dense_layers, up * width), (dense_layers, size.dense_width // tp * width)]
    if size.moe_layers:
        experts = size.experts * size.expert_width // tp * width
        layer_tensors += [(size.moe_layers, 2 * experts), (size.moe_layers, experts)]
        if size.shared_width:
            shared = size.shared_width // tp * width
            layer_tensors += [(size.moe_layers, 2 * shared), (size.moe_layers, shared)]
    vocabulary = round_up(size.vocab, 64) // tp * width
    tensors = [*layer_tensors, (1 if size.tied_embeddings else 2, vocabulary)]
    slack = sum(count * block_slack_bytes(elements * dtype_bytes) for count, elements in tensors)
    slack //= pipeline_parallel_size
    if not slack:
        return weights
    return weights.model_copy(update={
        "bytes": weights.bytes + slack,
        "source": weights.source + f"; {slack / MiB:.1f} MiB the CUDA caching allocator rounds the large weights' "
                                   "blocks up to (2 MiB segments it splits only past 1 MiB left)"})


def _unsplit_note(size: ModelSize, tensor_parallel_size: int, on_rank: dict[str, float]) -> str:
    """What a rank holds beyond its share of the linears, and which of them vLLM does not split."""
    unsplit = sum(on_rank.values()) - size.linear_params / tensor_parallel_size
    if unsplit < 1:
        return ""
    kv_copied = tensor_parallel_size > size.kv_heads and size.kv_projection_params
    whole = [name for name, held in (("the routers", size.router_params),
                                     ("MLA's down-projections", size.whole_mixer_params),
                                     ("K/V heads (fewer than the ranks)", kv_copied)) if held]
    return f", each rank holding {unsplit:,.0f} parameters more than its share ({' and '.join(whole)}: not split)"


def drafter_weights_term(config: dict[str, Any], size: ModelSize, speculative: SpeculativeDecoding | None,
                         dtype_bytes: int, tensor_parallel_size: int, pipeline_parallel_size: int,
                         in_checkpoint: bool) -> Term | None:
    """An MTP drafter's own weights, which the target leaves to it, on the last pipeline stage only; None for
    no drafter or one of another method (see `drafter_note`).

    The target model skips the checkpoint's MTP tensors (Qwen3NextForCausalLM maps `mtp.` to None, "MTP weights
    are loaded by the draft model", and Glm4MoeModel drops them with `skip_spec_layers`, qwen3_next.py and
    glm4_moe.py at 002d6073; DeepSeek-V2's loader skips every layer `get_spec_layer_idx_from_weight_name`
    places past num_hidden_layers), so the weights term holds none of them and the drafter adds, per MTP
    layer, one full-attention decoder layer of the target's layout. Qwen's predictor
    adds one `fc` (2 × hidden → hidden, a ColumnParallelLinear split over TP) for all its layers
    (qwen3_5_mtp.py at 01d99805, qwen3_next_mtp.py at 055e47c2); DeepSeek's and GLM's layers one `eh_proj`
    each, an nn.Linear whole on every rank (deepseek_mtp.py at 03356f8c, glm4_moe_mtp.py at 028aedf6). The
    proposer hands the drafter the target's lm_head, and its input embedding when there is one pipeline stage;
    with more, the last stage loads the drafter an embedding of its own (`_maybe_share_embeddings` and
    `_maybe_share_lm_head`, vllm/v1/spec_decode/llm_base_proposer.py at 00c4f22d). Norms, a few hidden-wide
    vectors, are left out as for the target's layers. A release whose DeepSeek or GLM MTP layer still holds
    its own `shared_head.head` holds one more vocab × hidden per layer, not counted here.
    """
    if speculative is None or speculative.method != "mtp":
        return None
    language = language_config(config)
    layers = mtp_layers(language, "config")
    if not layers:
        raise HarnessError("config: MTP drafting asked for, but the config has no mtp_num_hidden_layers or "
                           "num_nextn_predict_layers")
    tp = tensor_parallel_size
    qwen = str(language.get("model_type") or "").startswith("qwen")
    block = full_attention_layer_params(config)
    fc_params = 2 * size.hidden * size.hidden
    embedding = size.vocab * size.hidden if pipeline_parallel_size > 1 else 0
    per_gpu = layers * block / tp + (fc_params / tp if qwen else layers * fc_params) + embedding / tp
    fc = "one fc split over TP" if qwen else "an eh_proj each, whole on every rank"
    source = (f"MTP drafter: {layers} layer(s) of {block:,} parameters (a full-attention decoder layer of the "
              f"target's) and {fc} ({fc_params:,} parameters)"
              + (f", and its own input embedding ({embedding:,}) with pipeline stages" if embedding else "")
              + f", in {dtype_bytes} B each whatever the checkpoint's format (quantized checkpoints commonly leave "
              "mtp.* unquantized), on the last pipeline stage")
    if in_checkpoint:
        source += "; already in the checkpoint's own size, which holds the checkpoint's MTP tensors"
    return Term(name="drafter_weights", bytes=int(per_gpu * dtype_bytes), subtracted=not in_checkpoint,
                source=source)


def drafter_note(speculative: SpeculativeDecoding | None) -> list[str]:
    """What the waterfall leaves out of a drafter held in a checkpoint of its own."""
    if speculative is None or speculative.method not in OWN_CHECKPOINT_DRAFTERS:
        return []
    return [f"{speculative.method} drafter: a checkpoint of its own, whose size the target's config does not "
            "give; its weights are not counted"]


