"""The profiling run's activation peak, apart: the forward pass, the sampler, and a vision encoder's profile.

The waterfall prices the peak from these parts and the sampler fit (`harness/calibrate/field_check.py`) fits the
one figure the code leaves open, the sort's bytes per logit, against the same parts, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from packaging.version import Version

from harness.predict.encoder_profile import EncoderProfile, encoder_profile
from harness.predict.engine_launch import EngineLaunch
from harness.predict.parameter_count import ModelSize
from harness.predict.profile_batch import ProfileBatch

FUSED_MOE_CHUNK = 32_768  # envs.VLLM_FUSED_MOE_CHUNK_SIZE default: tokens a fused-MoE call caches at once


def forward_peak_bytes(size: ModelSize, tokens: int, tensor_parallel_size: int, dtype_bytes: int = 2) -> int:
    """The widest moment of one decoder layer in the profiling forward pass, on one rank.

    Dense MLP (LlamaMLP, Qwen2MLP `forward`): `gate_up` (2 × intermediate / TP) and the activated half
    (intermediate / TP) beside three hidden-wide tensors (the residual, the MLP input, the output or the
    norm's), and with TP the all-reduce's hidden-wide output; Llama-3.1-8B's V0 profiles of 20,000 and
    29,000 tokens (2.07 and 2.99 GiB logged) come out within 1%. MoE layer (fused_moe.py
    `fused_experts_impl`, 0.8-0.11): per token and routed expert a shared cache of max(2 × width / TP,
    hidden) and a second one of width / TP, for at most VLLM_FUSED_MOE_CHUNK_SIZE (32,768) tokens at
    a time, beside the residual, the input, the output and the shared experts' output.
    """
    tp, hidden = tensor_parallel_size, size.hidden
    base = 3 * hidden + (hidden if tp > 1 else 0)
    dense = tokens * (base + 3 * size.dense_width / tp) if size.dense_width else 0
    moe = 0.0
    if size.moe_layers:
        width = size.expert_width / tp
        routed = min(tokens, FUSED_MOE_CHUNK) * size.top_k * (max(2 * width, hidden) + width)
        moe = tokens * (base + (hidden if size.shared_experts else 0)) + routed
    return int(max(dense, moe) * dtype_bytes)


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
        forward_bytes=forward_peak_bytes(size, batch.tokens, tp, dtype_bytes),
        hidden_states_bytes=sampler_peak_bytes(size, batch.tokens, 0, 0, dtype_bytes),
        logits=batch.rows * size.vocab,
    )
