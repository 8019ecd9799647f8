"""The before-launch memory model, term by term, against figures worked out by hand from vLLM's source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.predict.encoder_launch import EncoderLaunch
from harness.predict.engine_launch import EngineLaunch
from harness.predict.memory_model import (
    ENCODER_PRICED_NOTE,
    ENCODER_PROFILE_NOTE,
    FITTED_CONSTANTS,
    V0_ENCODER_PRICED_NOTE,
    Waterfall,
    plan_waterfall,
)
from harness.predict.model_shape import load_model_shape
from harness.predict.term import Term
from harness.units import GiB

CORPUS = Path(__file__).parents[1] / "fixtures" / "field"


def _config(name: str) -> dict:
    return load_model_shape(str(CORPUS / "configs" / name)).config


def test_activation_is_the_larger_of_forward_and_sampler_and_the_sampler_is_an_input() -> None:
    # Qwen2-7B on an A100 under 0.10.1.1: 2,048 tokens, 256 rows. Forward (3 × 3,584 + 3 × 18,944) × 2 B ×
    # 2,048 = 276,824,064; FlashInfer sampler 2,048 × 3,584 × 2 + 256 × 152,064 × 14 = 14,680,064 + 544,997,376
    # = 559,677,440, the larger. The PyTorch sampler at 40 B: 14,680,064 + 1,557,135,360 = 1,571,815,424.
    config = _config("Qwen--Qwen2-7B-Instruct.json")
    constants = FITTED_CONSTANTS.model_copy(update={"sampler_bytes_per_logit": 40.0})

    def activation(**extra: Any) -> int:
        launch = EngineLaunch(gpu_memory_utilization=0.5, max_model_len=16384, engine_version="0.10.1.1", **extra)
        terms = plan_waterfall(config, constants, launch, total_bytes=int(79.25 * GiB), total_source="test",
                               gpu_name="A100-80GB").terms
        return next(t.bytes for t in terms if t.name == "activation_peak")

    assert activation(sampler="flashinfer") == 559_677_440
    assert activation(sampler="pytorch") == 1_571_815_424
    # V0 has no FlashInfer sampler unless asked: the PyTorch one, whatever is given.
    assert activation(sampler="flashinfer", engine_generation="V0") > 1_500_000_000


def test_non_torch_memory_counts_the_cuda_context_only_where_the_release_does() -> None:
    # V0 0.6.4 (worker.py) and V1 0.9.0 (gpu_worker.py) took everything on the device outside torch's allocator,
    # the CUDA context included; V0 0.6.5 and V1 0.9.1 count only the increase since the worker's first
    # snapshot. With 0.25 GiB of increase on an RTX 3090, whose 82 multiprocessors of compute capability 8.6 hold
    # 1,536 threads each, the context is its local memory, 82 × 1,536 × 1,024 B = 128,974,848 B, and the H200's
    # measured rest, int(262.8 × 1,048,576) = 275,565,772 B: 268,435,456 + 128,974,848 + 275,565,772 =
    # 672,976,076 B before, 0.25 GiB = 268,435,456 B after, on any GPU.
    config = _config("Qwen--Qwen2-7B-Instruct.json")
    constants = FITTED_CONSTANTS.model_copy(update={"non_torch_gib": 0.25})

    def non_torch(version: str, gpu: str | None = "RTX-3090", total_gib: float = 23.58) -> int:
        waterfall = plan_waterfall(config, constants, EngineLaunch(max_model_len=4096, engine_version=version),
                                   total_bytes=int(total_gib * GiB), total_source="test", gpu_name=gpu)
        return next(t.bytes for t in waterfall.terms if t.name == "non_torch")

    assert non_torch("0.6.4") == non_torch("0.9.0") == 672_976_076
    assert non_torch("0.6.5") == non_torch("0.9.1") == non_torch("0.11.0") == non_torch("0.11.0", "A100-80GB", 79.25) \
        == 268_435_456


def test_the_contexts_local_memory_follows_the_gpu_named_or_its_total() -> None:
    # An H100's 132 multiprocessors of capability 9.0 hold 2,048 threads each: 132 × 2,048 × 1,024 B =
    # 276,824,064 B. A log that states only 44.42 GiB ran on the one catalogue GPU printing that total, an L40S:
    # 142 × 1,536 × 1,024 = 223,346,688 B. A total no entry prints (47.5 GiB) is priced at the most threads
    # of any entry, a B200's 148 × 2,048: 310,378,496 B. With no base, each comes beside the measured rest of the
    # context, int(262.8 × 1,048,576) = 275,565,772 B: 552,389,836, 498,912,460 and 585,944,268 B.
    config = _config("Qwen--Qwen2-7B-Instruct.json")
    constants = FITTED_CONSTANTS.model_copy(update={"non_torch_gib": 0.0, "hopper_non_torch_gib": 0.0})

    def non_torch(gpu: str | None, total_gib: float) -> Term:
        waterfall = plan_waterfall(config, constants, EngineLaunch(max_model_len=4096, engine_version="0.6.3"),
                                   total_bytes=int(total_gib * GiB), total_source="test", gpu_name=gpu)
        return next(t for t in waterfall.terms if t.name == "non_torch")

    assert non_torch("H100-80GB", 79.22).bytes == 552_389_836
    l40s = non_torch(None, 44.42)
    assert l40s.bytes == 498_912_460 and "L40S's 218,112 resident threads" in l40s.source
    unnamed = non_torch(None, 47.5)
    assert unnamed.bytes == 585_944_268 and "multiprocessors are not known" in unnamed.source


def test_communicator_buffers_count_only_where_the_snapshot_precedes_the_distributed_set_up() -> None:
    # With 0.25 GiB of base and 0.5 GiB of NCCL (no release here counts the context): V0 (0.7.3) and V1 0.10.1.1
    # take their snapshot before init_worker_distributed_environment, so TP=2 counts 0.25 + 0.5 GiB + the custom
    # all-reduce's 2 × 8,192 × 1,024 = 16,777,216 B: 268,435,456 + 536,870,912 + 16,777,216 = 822,083,584 B. TP=3 has no
    # custom all-reduce (world sizes 2, 4, 6, 8 only): 805,306,368 B. V1 0.11.0 initialises NCCL first:
    # 268,435,456 B whatever the TP, as for one GPU. (Llama-3.1-8B's 32 attention heads split over 2, 4 and 8 ranks;
    # three ranks need 24 heads of 128 and one KV head, which changes no communicator.)
    config = _config("meta-llama--Llama-3.1-8B-Instruct.json")
    constants = FITTED_CONSTANTS.model_copy(update={"non_torch_gib": 0.25, "nccl_gib": 0.5})

    def non_torch(version: str, tp: int, generation: str | None = None) -> int:
        launch = EngineLaunch(max_model_len=4096, engine_version=version, tensor_parallel_size=tp,
                              engine_generation=generation)
        three = {"num_attention_heads": 24, "head_dim": 128, "num_key_value_heads": 1} if tp == 3 else {}
        waterfall = plan_waterfall({**config, **three}, constants, launch, total_bytes=80 * GiB, total_source="test")
        return next(t.bytes for t in waterfall.terms if t.name == "non_torch")

    assert non_torch("0.7.3", 2) == non_torch("0.10.1.1", 2) == 822_083_584
    assert non_torch("0.10.1.1", 4, "V0") == 822_083_584
    assert non_torch("0.7.3", 3) == 805_306_368
    assert non_torch("0.11.0", 2) == non_torch("0.19.0", 8) == non_torch("0.7.3", 1) == 268_435_456


def test_a_tensor_parallel_start_before_0_9_says_how_far_its_communicators_may_be_off() -> None:
    # Public logs of 0.6.6-0.8.3 tensor-parallel starts hold 0.29 to 2.24 GiB a rank outside torch, against 0.11 to
    # 0.21 from 0.9: the term is priced as for later releases (0.129 + 0.04 GiB), and its source says by how much it
    # may fall short: 2.24 - 0.169 = 2.07, up to 2.1 GiB.
    config = _config("meta-llama--Llama-3.1-8B-Instruct.json")

    def source(version: str, tp: int) -> str:
        launch = EngineLaunch(max_model_len=4096, engine_version=version, tensor_parallel_size=tp)
        waterfall = plan_waterfall(config, FITTED_CONSTANTS, launch, total_bytes=80 * GiB, total_source="test")
        return next(t.source for t in waterfall.terms if t.name == "non_torch")

    assert source("0.8.3", 4).endswith("this figure may be low by up to 2.1 GiB")
    assert "may be low" not in source("0.9.0", 4) + source("0.8.3", 1) + source("0.11.0", 2)


def test_nvls_buffers_join_the_non_torch_memory_on_an_nvswitch_board_past_two_gpus() -> None:
    # NCCL's "nvlsPerRankSize 301989888" (24 channels × 2 × (4 MiB + 2 MiB)) times the ranks: TP=4 on H100s
    # holds 4 × 301,989,888 = 1,207,959,552 B more, in 0.9.2 (communicators counted) and in 0.11.0 (not) alike,
    # since NCCL connects NVLS in the profile's all-reduce. TP=2, a PCIe H100 or an A100 add nothing. (One base
    # for every GPU here, so that only the NVLS buffers differ; Llama-3.1-8B's 32 heads split over 8 ranks.)
    config = _config("meta-llama--Llama-3.1-8B-Instruct.json")
    constants = FITTED_CONSTANTS.model_copy(update={"hopper_non_torch_gib": FITTED_CONSTANTS.non_torch_gib})

    def non_torch(version: str, tp: int, gpu: str | None) -> int:
        launch = EngineLaunch(max_model_len=4096, engine_version=version, tensor_parallel_size=tp)
        waterfall = plan_waterfall(config, constants, launch, total_bytes=80 * GiB, total_source="test", gpu_name=gpu)
        return next(t.bytes for t in waterfall.terms if t.name == "non_torch")

    for version in ("0.9.2", "0.11.0"):
        assert non_torch(version, 4, "H100-80GB") - non_torch(version, 4, "A100-80GB") == 1_207_959_552
        assert non_torch(version, 4, "NVIDIA H100 80GB HBM3") == non_torch(version, 4, "H100-80GB")
        assert non_torch(version, 4, "NVIDIA H100 PCIe") == non_torch(version, 4, "A100-80GB")
        assert non_torch(version, 2, "H200") == non_torch(version, 2, "A100-80GB")
    assert non_torch("0.11.0", 8, "H200") - non_torch("0.11.0", 8, None) == 2_415_919_104  # nvlsTotalSize


def test_a_hopper_part_and_a_gb10_get_the_bases_fitted_on_their_own_starts() -> None:
    # One GPU, 0.11.0 (no context, no communicators): the base alone, 0.596 GiB on an H100 or H200 (the median of
    # the fit half's Hopper starts), 2.261 GiB on a GB10, whose figure also holds what its host allocated (the
    # median of the fit half's two GB10 starts, 1.992 and 2.529), 0.129 GiB elsewhere: int(0.596 × 2³⁰) =
    # 639,950,127 B, int(2.261 × 2³⁰) = 2,427,730,264 B and int(0.129 × 2³⁰) = 138,512,695 B.
    config = _config("Qwen--Qwen2-7B-Instruct.json")

    def non_torch(gpu: str | None) -> int:
        waterfall = plan_waterfall(config, FITTED_CONSTANTS, EngineLaunch(max_model_len=4096, engine_version="0.11.0"),
                                   total_bytes=80 * GiB, total_source="test", gpu_name=gpu)
        return next(t.bytes for t in waterfall.terms if t.name == "non_torch")

    assert non_torch("H100-80GB") == non_torch("NVIDIA H200") == non_torch("GH200") == 639_950_127
    assert non_torch("GB10") == non_torch("NVIDIA GB10") == non_torch("DGX Spark") == 2_427_730_264
    assert non_torch("A100-80GB") == non_torch("RTX-PRO-6000-Blackwell") == non_torch(None) == 138_512_695


def test_eager_mode_captures_no_cuda_graphs_so_from_0_21_their_reservation_goes_to_the_cache() -> None:
    # From 0.21 vLLM reserves its CUDA-graph estimate before sizing the cache (the fitted 0.54 GiB here,
    # int(0.54 × 2³⁰) = 579,820,584 B); --enforce-eager captures none, so the cache gets those bytes. Before 0.21
    # the graphs are captured after the cache: the cache is the same, only what the warm-up has left differs.
    config = _config("Qwen--Qwen2-7B-Instruct.json")

    def plan(version: str, eager: bool) -> Waterfall:
        launch = EngineLaunch(max_model_len=4096, engine_version=version, enforce_eager=eager)
        return plan_waterfall(config, FITTED_CONSTANTS, launch, total_bytes=80 * GiB, total_source="test")

    def graphs(waterfall: Waterfall) -> int:
        return next(term.bytes for term in waterfall.terms if term.name == "cuda_graphs")

    assert graphs(plan("0.30.0", False)) == 579_820_584 and graphs(plan("0.30.0", True)) == 0
    # Eager, the forward pass is priced by Python's references (activation.py): Qwen2-7B over 8,192 tokens holds one
    # more hidden-wide tensor, 3,584 × 8,192 × 2 B = 58,720,256 B, and under 0.30's greedy sampler that pass is the
    # peak. So the cache gains 579,820,584 − 58,720,256 = 521,100,328 B.
    assert plan("0.30.0", True).kv_bytes - plan("0.30.0", False).kv_bytes == 521_100_328
    # Under 0.11 the sort sampler over 1,024 rows is the peak either way, and the graphs come after the cache.
    assert plan("0.11.0", True).kv_bytes == plan("0.11.0", False).kv_bytes


def test_the_second_runner_counts_its_sampling_state_from_0_27_and_reserves_graphs_from_0_29() -> None:
    # Qwen2-7B runs on the second runner from 0.25, with V1's default 1,024 requests on an 80 GiB GPU. Its sampling
    # state: output_bin_counts 1,024 × 152,064 × 4 B = 622,854,144 B, and the prompt and grammar bitmasks, each
    # 1,024 × ⌈152,064 / 32⌉ = 4,752 words × 4 B = 19,464,192 B: 661,782,528 B, which 0.27's consumed memory counts
    # and 0.26's profile missed. Its graphs are estimated, and reserved before the cache, only from 0.29.
    def plan(version: str, pipeline: int = 1, name: str = "Qwen--Qwen2-7B-Instruct.json") -> Waterfall:
        launch = EngineLaunch(max_model_len=4096, engine_version=version, pipeline_parallel_size=pipeline)
        return plan_waterfall(_config(name), FITTED_CONSTANTS, launch, total_bytes=80 * GiB, total_source="test")

    def term(waterfall: Waterfall, name: str) -> Term:
        return next(term for term in waterfall.terms if term.name == name)

    base = term(plan("0.26.0"), "non_torch").bytes
    assert [term(plan(v), "non_torch").bytes - base for v in ("0.27.1", "0.28.0", "0.29.0")] == [661_782_528] * 3
    assert "sampling state" in term(plan("0.27.1"), "non_torch").source
    assert [term(plan(v), "cuda_graphs").subtracted for v in ("0.26.0", "0.27.1", "0.28.0", "0.29.0")] == [
        False, False, False, True]
    assert "the second runner estimates none before 0.29" in term(plan("0.28.0"), "cuda_graphs").source
    # Only the last pipeline stage samples: the first keeps the state's bytes for its cache (the two stages' weights
    # are equal: 14 layers and an embedding or an lm_head of the same size each).
    first, last = plan("0.27.1", pipeline=2).stage_kv_bytes
    assert first - last == 661_782_528
    # Qwen3-30B-A3B, an MoE model, stays on the first runner in 0.28: no such state, and its graphs are reserved.
    moe = plan("0.28.0", name="Qwen--Qwen3-30B-A3B.json")
    assert term(moe, "non_torch").bytes == base and term(moe, "cuda_graphs").subtracted


def test_a_vision_language_waterfall_says_whether_the_encoder_profile_is_priced() -> None:
    def assumptions(config_name: str, version: str = "0.12.0", generation: str | None = None,
                    skipped: bool = False) -> list[str]:
        config = load_model_shape(str(CORPUS / "configs" / config_name)).config
        launch = EngineLaunch(max_model_len=4096, engine_version=version, engine_generation=generation,
                              encoder=EncoderLaunch(skipped=skipped))
        return plan_waterfall(config, FITTED_CONSTANTS, launch, total_bytes=80 * GiB, total_source="test").assumptions

    assert ENCODER_PRICED_NOTE in assumptions("Qwen--Qwen3-VL-30B-A3B-Instruct.json")
    assert ENCODER_PRICED_NOTE in assumptions("Qwen--Qwen2.5-VL-7B-Instruct.json")
    assert V0_ENCODER_PRICED_NOTE in assumptions("Qwen--Qwen2.5-VL-7B-Instruct.json", "0.8.3", "V0")
    assert ENCODER_PROFILE_NOTE in assumptions("Qwen--Qwen2.5-VL-7B-Instruct.json", "0.9.2", "V0")  # not read
    assert ENCODER_PROFILE_NOTE in assumptions("llava-hf--llava-1.5-7b-hf.json")
    skipped = assumptions("Qwen--Qwen3-VL-30B-A3B-Instruct.json", skipped=True)
    text_only = assumptions("Qwen--Qwen3-30B-A3B.json")
    assert not {ENCODER_PROFILE_NOTE, ENCODER_PRICED_NOTE, V0_ENCODER_PRICED_NOTE} & {*skipped, *text_only}


def test_the_encoder_profile_raises_the_activation_peak_by_what_it_holds() -> None:
    # Qwen3-VL-30B-A3B on 0.12.0 at 65,536 tokens holds 2,868,903,936 B through the decoder's dummy run
    # (test_encoder_profile.py); the encoder's own peak is below that, so the activation peak is the decoder's or
    # the sampler's plus exactly those bytes, and skipping the profile takes them off again.
    config = load_model_shape(str(CORPUS / "configs" / "Qwen--Qwen3-VL-30B-A3B-Instruct.json")).config

    def activation(encoder: EncoderLaunch) -> int:
        launch = EngineLaunch(max_model_len=65536, engine_version="0.12.0", tensor_parallel_size=2, encoder=encoder)
        waterfall = plan_waterfall(config, FITTED_CONSTANTS, launch, total_bytes=80 * GiB, total_source="test")
        return next(t.bytes for t in waterfall.terms if t.name == "activation_peak")

    assert activation(EncoderLaunch()) - activation(EncoderLaunch(skipped=True)) == 2_868_903_936


def test_only_weights_held_in_the_models_dtype_carry_the_allocators_slack() -> None:
    # The slack is reckoned from the 16-bit tensors' shapes; a quantized layout's packed tensors are other shapes.
    config = _config("Qwen--Qwen2-7B-Instruct.json")

    def weights(quantization: str | None) -> Term:
        launch = EngineLaunch(max_model_len=4096, engine_version="0.11.0", quantization=quantization)
        waterfall = plan_waterfall(config, FITTED_CONSTANTS, launch, total_bytes=80 * GiB, total_source="test")
        return next(term for term in waterfall.terms if term.name == "weights")

    assert "57.0 MiB the CUDA caching allocator" in weights(None).source
    assert "allocator" not in weights("fp8").source


def test_no_waterfall_for_a_tensor_parallel_size_vllm_refuses() -> None:
    # Qwen3-8B has 32 attention heads; vLLM refuses a size that does not divide them, so the waterfall gives no
    # figure for one (a log's `Worker_TP<n>` prefixes can claim any size) and names why, as the block arithmetic does.
    config = _config("Qwen--Qwen3-8B.json")

    def waterfall(tensor_parallel_size: int) -> Waterfall:
        return plan_waterfall(config, FITTED_CONSTANTS,
                              EngineLaunch(engine_version="0.11.2", max_model_len=4096,
                                           tensor_parallel_size=tensor_parallel_size),
                              total_bytes=80 * GiB, total_source="test")

    assert waterfall(4).kv_bytes > 0
    with pytest.raises(HarnessError, match="tensor_parallel_size 3 does not divide the model's 32 attention heads"):
        waterfall(3)
