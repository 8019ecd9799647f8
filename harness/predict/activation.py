"""The profiling run's activation peak, apart: the forward pass, the sampler, and a vision encoder's profile.

The waterfall prices the peak from these parts and the sampler fit (`harness/calibrate/field_check.py`) fits the
one figure the code leaves open, the sort's bytes per logit, against the same parts, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from packaging.version import Version

from harness.predict.architectures import mlp_keeps_up_output
from harness.predict.encoder_profile import EncoderProfile, encoder_profile
from harness.predict.engine_launch import EngineLaunch
from harness.predict.parameter_count import ModelSize
from harness.predict.profile_batch import ProfileBatch

FUSED_MOE_CHUNK = 32_768  # envs.VLLM_FUSED_MOE_CHUNK_SIZE default: tokens a fused-MoE call caches at once
# Before 0.6.5 a tensor-parallel all-reduce too large for the custom all-reduce ran in place (parallel_state.py
# `inplace_all_reduce`, read in 0.6.3 and 0.6.4); from 0.6.5 every one returns a new tensor (`all_reduce` calls
# `_all_reduce_out_place`, read in 0.6.5, 0.7.2 and 0.8.3). A profile's activations outgrow the custom one's 8 MiB.
ALL_REDUCE_OUT_OF_PLACE_SINCE = Version("0.6.5")


class LayerCode(NamedTuple):
    """How a release's decoder layer holds its tensors in the profiling forward pass."""

    eager: bool  # run as Python (V0, or V1 under --enforce-eager), not as torch.compile's graphs
    reduced_copy: bool  # the tensor-parallel all-reduce returns a new tensor
    keeps_up_output: bool  # the dense MLP holds its up projection's output through the down projection


COMPILED = LayerCode(eager=False, reduced_copy=True, keeps_up_output=True)


def layer_code(config: dict[str, Any], version: Version, v0: bool, enforce_eager: bool = False) -> LayerCode:
    """The layer code of this release and model family; V0 never compiles, V1 not under --enforce-eager."""
    return LayerCode(eager=v0 or enforce_eager, reduced_copy=version >= ALL_REDUCE_OUT_OF_PLACE_SINCE,
                     keeps_up_output=mlp_keeps_up_output(config, version))


def forward_peak_bytes(size: ModelSize, tokens: int, tensor_parallel_size: int, dtype_bytes: int = 2,
                       code: LayerCode = COMPILED) -> int:
    """The widest moment of one decoder layer in the profiling forward pass, on one rank.

    MoE layer (fused_moe.py `fused_experts_impl`, 0.8-0.11): per token and routed expert a shared cache of
    max(2 × width / TP, hidden) and a second one of width / TP, for at most VLLM_FUSED_MOE_CHUNK_SIZE (32,768)
    tokens at a time, beside the residual, the input, the output and the shared experts' output, and with TP the
    all-reduce's output where it makes a copy. Dense layer: `_dense_layer_values`.
    """
    tp, hidden = tensor_parallel_size, size.hidden
    reduced = hidden if tp > 1 and code.reduced_copy else 0
    base = 3 * hidden + reduced
    dense = tokens * _dense_layer_values(size, tp, code, reduced) if size.dense_width else 0
    moe = 0.0
    if size.moe_layers:
        width = size.expert_width / tp
        routed = min(tokens, FUSED_MOE_CHUNK) * size.top_k * (max(2 * width, hidden) + width)
        moe = tokens * (base + (hidden if size.shared_experts else 0)) + routed
    return int(max(dense, moe) * dtype_bytes)


def _dense_layer_values(size: ModelSize, tensor_parallel_size: int, code: LayerCode, reduced: int) -> float:
    """Values per token alive at a dense layer's widest moment.

    Run eagerly (V0; V1 under --enforce-eager), Python's references decide: the model's loop (`hidden_states,
    residual = layer(...)`) holds the layer's input while the layer runs, beside the residual and the MLP's input.
    At the activation the up projection's output (2 × width / TP gated, else width / TP) sits beside the activated
    half (width / TP). At the down projection its output, and the all-reduced copy where there is one
    (`reduced`), sits beside the activated half and, in the MLPs that keep it (Qwen2MLP's `gate_up`, LlamaMLP's
    through 0.6.3: architectures.py), the up projection's output. Logged eager profiles: V0 Llama-3.1-8B under
    0.6.4 over 20,000 and 29,000 tokens (2.07 and 2.99 GiB), Qwen2.5-14B at TP 2 over 32,768 (2.84),
    Qwen2.5-VL-72B's decoder at TP 4 over 16,384 beside its pixels (2.51), V1 0.29 Qwen3-8B over 4,096 (0.41),
    each within 1%; V1 0.30 Qwen2.5-3B over 2,048 logs 0.15 against 0.157 priced, one hidden-wide tensor less,
    for a reason not found.

    Compiled (V1's default), torch.compile's graphs free each intermediate after its last use, which Python's
    references do not show: three hidden-wide tensors, with TP the all-reduce's output, and three widths, whatever
    the MLP; no compiled start in the field corpus is bound by its forward pass to check it against.
    """
    hidden, width = size.hidden, size.dense_width / tensor_parallel_size
    if not code.eager:
        return 3 * hidden + reduced + 3 * width
    up = 2 * width if size.gated_mlp else width
    at_activation = 3 * hidden + up + width
    at_down_projection = 3 * hidden + width + hidden + reduced + (up if code.keeps_up_output else 0)
    return max(at_activation, at_down_projection)


def sampler_peak_bytes(size: ModelSize, tokens: int, rows: int, bytes_per_logit: float, dtype_bytes: int = 2) -> int:
    """The sampler's peak over `rows` logits rows of the whole vocabulary, beside the batch's hidden states.

    vLLM samples the profiling batch with top-k = vocabulary − 1 and top-p < 1 (V1 gpu_model_runner.py
    `_dummy_sampler_run`, V0 model_runner.py `_dummy_run`), and vocabulary-parallel logits are gathered
    first, so every row is the full vocabulary. The hidden states of all tokens are still held.
    """
    return int(tokens * size.hidden * dtype_bytes + rows * size.vocab * bytes_per_logit)


class ActivationParts(NamedTuple):
    """One rank's profiling run in the parts its peak is the larger of: an encoder's widest moment (V1 profiles
    it before the pass, V0 runs it inside), or what the batch's inputs and the encoder's outputs hold beside the
    larger of the forward pass and the sampler (its hidden states and `logits` entries at a figure each)."""

    encoder: EncoderProfile | None  # V1's encoder profile, where one is priced
    encoder_peak_bytes: int
    held_bytes: int
    forward_bytes: int
    hidden_states_bytes: int
    logits: int

    def sampler_bytes(self, bytes_per_logit: float) -> int:
        return int(self.hidden_states_bytes + self.logits * bytes_per_logit)

    def peak_bytes(self, bytes_per_logit: float) -> int:
        return max(self.encoder_peak_bytes,
                   self.held_bytes + max(self.forward_bytes, self.sampler_bytes(bytes_per_logit)))

    def unsampled_bytes(self) -> int:
        """The peak of a pipeline stage before the last, which computes no logits."""
        return max(self.encoder_peak_bytes, self.held_bytes + self.forward_bytes)


def activation_parts(config: dict[str, Any], size: ModelSize, version: Version, v0: bool, launch: EngineLaunch,
                     batch: ProfileBatch, config_source: str = "config") -> ActivationParts:
    """The parts of the launch's profiling run over `batch` (profile_batch.py)."""
    tp, dtype_bytes = launch.tensor_parallel_size, launch.dtype_bytes
    encoder = None if v0 else encoder_profile(
        config, version, max_model_len=launch.max_model_len, batched_tokens=batch.tokens, max_num_seqs=batch.rows,
        tensor_parallel_size=tp, dtype_bytes=dtype_bytes, launch=launch.encoder, source=config_source)
    return ActivationParts(
        encoder=encoder,
        encoder_peak_bytes=encoder.encoder_peak_bytes if encoder else batch.encoder_peak_bytes,
        held_bytes=(encoder.held_bytes if encoder else 0) + batch.held_bytes,
        forward_bytes=forward_peak_bytes(size, batch.tokens, tp, dtype_bytes,
                                         layer_code(config, version, v0, launch.enforce_eager)),
        hidden_states_bytes=sampler_peak_bytes(size, batch.tokens, 0, 0, dtype_bytes),
        logits=batch.rows * size.vocab,
    )
