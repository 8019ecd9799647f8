"""The profiling run's activation parts: each figure worked out from the layer code it cites."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from harness.predict.activation import ActivationParts, LayerCode, forward_peak_bytes, layer_code, sampler_peak_bytes
from harness.predict.model_shape import load_model_shape
from harness.predict.parameter_count import model_size
from harness.predict.sampler_peak import FLASHINFER_BYTES_PER_LOGIT

CORPUS = Path(__file__).parents[1] / "fixtures" / "field"


def _config(name: str) -> dict:
    return load_model_shape(str(CORPUS / "configs" / name)).config


def test_dense_forward_peak_holds_gate_up_beside_the_activated_half() -> None:
    # Llama-3.1-8B, TP=1, V0 0.6.4's 20,000-token profile: residual, the layer's input and the MLP input
    # (3 × 4,096) beside gate_up (2 × 14,336) and the activated half (14,336): 55,296 values × 2 B × 20,000 =
    # 2,211,840,000 B = 2.06 GiB. The 0.6.4 log printed peak_torch_memory 17.06 GiB less 14.99 GiB of weights =
    # 2.07 GiB.
    config = _config("meta-llama--Llama-3.1-8B-Instruct.json")
    size, v0_64 = model_size(config), layer_code(config, Version("0.6.4"), v0=True)
    assert v0_64 == LayerCode(eager=True, reduced_copy=False, keeps_up_output=False)
    assert forward_peak_bytes(size, 20_000, 1, code=v0_64) == 2_211_840_000
    # 0.6.3's LlamaMLP kept gate_up through the down projection: 4 × 4,096 + 3 × 14,336 = 59,392 values, and
    # 59,392 × 2 B × 20,000 = 2,375,680,000.
    v0_63 = layer_code(config, Version("0.6.3"), v0=True)
    assert forward_peak_bytes(size, 20_000, 1, code=v0_63) == 2_375_680_000
    # TP=2 under 0.7.2, whose all-reduce copies: at the activation 3 × 4,096 + 2 × 7,168 + 7,168 = 33,792; at the
    # down projection, gate_up rebound away, 3 × 4,096 + 7,168 + 4,096 (output) + 4,096 (all-reduced) = 27,648.
    # The activation wins: 33,792 × 2 B × 2,048 = 138,412,032.
    assert forward_peak_bytes(size, 2048, 2, code=layer_code(config, Version("0.7.2"), v0=True)) == 138_412_032
    # Compiled (V1): (4 × 4,096 + 3 × 7,168) × 2 B × 2,048 = 155,189,248.
    assert forward_peak_bytes(size, 2048, 2) == 155_189_248


def test_an_mlp_that_keeps_gate_up_peaks_at_its_down_projection() -> None:
    # Qwen2.5-14B, TP=2, V0 0.7.2 over 32,768 tokens (v072-qwen25-14b-tp2-fp16). Qwen2MLP keeps gate_up (2 × 6,912)
    # while down_proj writes: 3 × 5,120 + 6,912 (activated) + 5,120 (output) + 5,120 (all-reduced) + 13,824 = 46,336
    # values, against 36,096 at the activation. 46,336 × 2 B × 32,768 = 3,036,676,096 B = 2.83 GiB; its log states
    # "PyTorch activation peak memory takes 2.84GiB" (the sampler, 256 rows, is narrower).
    config = _config("Qwen--Qwen2.5-14B.json")
    size = model_size(config)
    assert forward_peak_bytes(size, 32_768, 2, code=layer_code(config, Version("0.7.2"), v0=True)) == 3_036_676_096
    # Under 0.6.4 the all-reduce ran in place: 5,120 fewer values, 41,216 × 2 B × 32,768 = 2,701,131,776 B. So
    # does the compiled figure, for another reason: three hidden-wide tensors, the all-reduce's and three widths.
    v0_64 = layer_code(config, Version("0.6.4"), v0=True)
    assert forward_peak_bytes(size, 32_768, 2, code=v0_64) == forward_peak_bytes(size, 32_768, 2) == 2_701_131_776


def test_v1_under_enforce_eager_is_priced_as_python_runs_it() -> None:
    # Qwen3-8B on 0.29 with --enforce-eager over 4,096 tokens (v0290-qwen3-8b-rtx4090-48gb-eager-util075-len4096):
    # at the down projection 3 × 4,096 + 12,288 (activated) + 4,096 (output) + 24,576 (gate_up) = 53,248 values,
    # 53,248 × 2 B × 4,096 = 436,207,616 B = 0.41 GiB, as its log states ("0.41 GiB for peak activation"); compiled,
    # (3 × 4,096 + 3 × 12,288) × 2 B × 4,096 = 402,653,184 B (0.38).
    config = _config("Qwen--Qwen3-8B.json")
    size, release = model_size(config), Version("0.29.0")
    eager = layer_code(config, release, v0=False, enforce_eager=True)
    assert forward_peak_bytes(size, 4096, 1, code=eager) == 436_207_616
    assert forward_peak_bytes(size, 4096, 1, code=layer_code(config, release, v0=False)) == 402_653_184


def test_a_wrapper_takes_its_language_models_mlp() -> None:
    # llava-1.5's language model is Llama (text_config model_type "llama"): LlamaMLP, which rebinds gate_up.
    release = Version("0.8.3")
    assert not layer_code(_config("llava-hf--llava-1.5-7b-hf.json"), release, v0=True).keeps_up_output
    assert layer_code(_config("Qwen--Qwen2.5-VL-72B-Instruct.json"), release, v0=True).keeps_up_output
    # OPT's fc1 → activation → fc2 rebinds one name too; Mistral and Phi-3 are served by LlamaMLP.
    for name in ("facebook--opt-125m.json", "mistralai--Mistral-7B-v0.1.json",
                 "microsoft--Phi-3-mini-4k-instruct.json"):
        assert not layer_code(_config(name), release, v0=True).keeps_up_output, name
    # A model_type that is no name (a list, a mapping) names no family: the larger figure, no error.
    for model_type in (["llama"], {"llama": 1}):
        config = _config("llava-hf--llava-1.5-7b-hf.json")
        config = {**config, "text_config": {**config["text_config"], "model_type": model_type}}
        assert layer_code(config, release, v0=True).keeps_up_output


def test_moe_forward_peak_counts_the_fused_moe_caches_per_routed_copy() -> None:
    # Qwen3-235B-A22B, TP=4, 8,192 tokens: 3 × 4,096 + 4,096 (all-reduce) = 16,384 values per token, and
    # per routed copy (8) fused_experts_impl's cache13 of max(2 × 1,536 / 4, 4,096) = 4,096 and cache2 of 384:
    # 8 × 4,480 = 35,840. (16,384 + 35,840) × 8,192 × 2 B = 855,638,016 B.
    size = model_size(_config("Qwen--Qwen3-235B-A22B-FP8.json"))
    assert forward_peak_bytes(size, 8192, 4) == 855_638_016


def test_a_model_with_dense_and_moe_layers_peaks_at_the_wider() -> None:
    # DeepSeek-V2-Lite, TP=2, 2,048 tokens. Dense first layer: 4 × 2,048 + 3 × 10,944 / 2 = 24,608 values.
    # MoE layers: 4 × 2,048 + 2,048 (shared experts' output) = 10,240, plus 6 routed copies of
    # max(2 × 1,408 / 2, 2,048) + 704 = 2,752, i.e. 16,512: 26,752 values, wider than the dense layer.
    # 26,752 × 2,048 × 2 B = 109,576,192 B.
    size = model_size(_config("deepseek-ai--DeepSeek-V2-Lite.json"))
    assert forward_peak_bytes(size, 2048, 2) == 109_576_192


def test_sampler_peak_is_rows_times_the_whole_vocabulary() -> None:
    # Qwen3-235B on H100s (V1 ≥ 70 GiB: 1,024 rows), FlashInfer at 14 B per logit: 1,024 × 151,936 × 14 =
    # 2,178,154,496 B, beside the 8,192 tokens' hidden states (8,192 × 4,096 × 2 B = 67,108,864).
    size = model_size(_config("Qwen--Qwen3-235B-A22B-FP8.json"))
    assert sampler_peak_bytes(size, 8192, 1024, FLASHINFER_BYTES_PER_LOGIT) == 2_245_263_360


def test_the_peak_is_the_encoder_or_what_is_held_beside_the_wider_of_pass_and_sampler() -> None:
    # 5 B of encoder moment; 2 B held beside a 3 B pass or a sampler of 1 B of hidden states and 10 logits.
    parts = ActivationParts(encoder=None, encoder_peak_bytes=5, held_bytes=2, forward_bytes=3, hidden_states_bytes=1,
                            logits=10)
    # At 0.1 B a logit the sampler is 1 + 1 = 2 B: 2 + max(3, 2) = 5, the encoder's moment, which ties.
    assert parts.peak_bytes(0.1) == 5
    # At 1 B a logit the sampler is 1 + 10 = 11 B: 2 + 11 = 13, above the encoder.
    assert parts.peak_bytes(1.0) == 13
    # A stage before the last samples nothing: max(5, 2 + 3) = 5.
    assert parts.unsampled_bytes() == 5
