"""The sampler's warm-up peak per release and top-k/top-p path, priced from each release's code."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from harness.calibrate.field_check import run_field_check
from harness.predict.engine_launch import EngineLaunch
from harness.predict.memory_model import FITTED_CONSTANTS, plan_waterfall
from harness.predict.model_shape import load_model_shape
from harness.predict.sampler_peak import (
    FLASHINFER,
    SORT_V0,
    SORT_V1,
    TRITON,
    release_default_sampler,
    sampler_of_start,
    sampler_path,
)
from harness.units import GiB

CORPUS = Path(__file__).parents[1] / "fixtures" / "field"
QWEN2_7B = load_model_shape(str(CORPUS / "configs" / "Qwen--Qwen2-7B-Instruct.json")).config


def _activation(version: str, sampler: str | None = None, gpu: str = "H100-80GB") -> tuple[str, int]:
    launch = EngineLaunch(max_model_len=4096, engine_version=version, sampler=sampler)
    waterfall = plan_waterfall(QWEN2_7B, FITTED_CONSTANTS, launch, total_bytes=int(79.22 * GiB), total_source="test",
                               gpu_name=gpu)
    assert waterfall.sampler is not None
    return waterfall.sampler.path, next(t.bytes for t in waterfall.terms if t.name == "activation_peak")


def test_triton_path_from_0_17_is_fourteen_bytes_per_logit() -> None:
    # Qwen2-7B under 0.19 on an H100 (V1 ≥ 70 GiB: 8,192 tokens, 1,024 rows). bf16 logits 2 B + fp32 copy 4 B,
    # masked in place by apply_top_k_top_p_triton, then the fp32 softmax 4 B and random_sample's draws 4 B:
    # 14 B. 8,192 × 3,584 × 2 B of hidden states = 58,720,256 B + 1,024 × 152,064 × 14 = 2,179,989,504 B
    # = 2,238,709,760 B, above the forward pass's (3 × 3,584 + 3 × 18,944) × 2 B × 8,192 = 1,107,296,256 B.
    assert _activation("0.19.0") == ("triton", 2_238_709_760)
    # 0.22 runs a second warm-up call with a seeded generator, which leaves FlashInfer for the native path.
    assert _activation("0.22.0", "flashinfer") == ("triton", 2_238_709_760)


def test_the_second_runner_warms_up_on_a_greedy_batch_that_holds_its_logits_alone() -> None:
    # Qwen2-7B (dense, Qwen2ForCausalLM) on an H100: 8,192 tokens, 1,024 rows. 0.26 gives such a model the second
    # runner, whose greedy dummy batch leaves the bf16 logits as they are: 58,720,256 B of hidden states +
    # 1,024 × 152,064 × 2 B = 311,427,072 B = 370,147,328 B, below the forward pass's 1,107,296,256 B, which is
    # then the peak. 0.25 copies them to fp32 first: 58,720,256 + 1,024 × 152,064 × 6 B = 992,999,424 B, still
    # below it. 0.24 named no Qwen2 model for it: the first runner's Triton path, 2,238,709,760 B as above.
    assert _activation("0.26.0") == _activation("0.29.0") == ("greedy", 1_107_296_256)
    assert _activation("0.25.0") == ("greedy", 1_107_296_256)
    assert sampler_path(Version("0.25.0"), None, "pytorch", 1024, second_runner=True).bytes_per_logit == 6
    assert sampler_path(Version("0.26.0"), None, "pytorch", 1024, second_runner=True).bytes_per_logit == 2
    assert _activation("0.24.0") == ("triton", 2_238_709_760)


def test_flashinfer_path_before_0_22_is_fourteen_bytes_per_logit() -> None:
    # 0.16 with FlashInfer: 2 B + 4 B logits, the top-k-masked copy 4 B and its softmax 4 B = 14 B, the same
    # 2,238,709,760 B as above for the same batch.
    assert _activation("0.16.0", "flashinfer") == ("flashinfer", 2_238_709_760)


def test_sort_path_before_0_17_is_the_fitted_figure() -> None:
    # 0.16's native path sorts: 58,720,256 + 1,024 × 152,064 × 36.71 B (fitted) = 58,720,256 + 5,716,243,906.56
    # = 5,774,964,162 B, 2.6 times the Triton path's peak a release later.
    assert FITTED_CONSTANTS.sampler_bytes_per_logit == 36.71
    assert _activation("0.16.0") == ("sort", 5_774_964_162)
    # From 0.11.2 FlashInfer is opt-in, so an unstated sampler is the native sort by the code itself; on an
    # A100 (2,048 tokens, 256 rows): 2,048 × 3,584 × 2 = 14,680,064 + 256 × 152,064 × 36.71 = 1,429,060,976.64,
    # 1,443,741,040 B in all.
    assert _activation("0.11.2", gpu="A100-80GB") == ("sort", 1_443_741_040)


def test_fewer_than_128_rows_sort_as_one_array_and_hold_12_bytes_more_per_logit() -> None:
    # PyTorch sorts 2 to 127 rows flattened: two 8 B (index, segment) buffers, a 4 B keys copy and the radix
    # sort's 4 + 8 B alternates = 32 B of scratch, against 8 + 4 + 8 = 20 B for the segmented sort of 128 rows
    # or more (and for one row). An H200 measured 50.2 against 38.0 B per logit (sampler_peak.py).
    few, many, one = (sampler_path(Version("0.10.1.1"), None, "pytorch", rows) for rows in (64, 128, 1))
    assert (few.priced(36.11), many.priced(36.11), one.priced(36.11)) == (36.11 + 12, 36.11, 36.11)
    assert sampler_path(Version("0.6.3"), None, "pytorch", 127).priced(36.11) == 36.11 + 12
    # Qwen2-7B under 0.11.2 on an A100 with max_num_seqs 64: 2,048 tokens, 64 rows. 2,048 × 3,584 × 2 B =
    # 14,680,064 + 64 × 152,064 × 48.71 B = 474,050,396.16, 488,730,460 B in all, above the forward pass's
    # (3 × 3,584 + 3 × 18,944) × 2 B × 2,048 = 276,824,064.
    launch = EngineLaunch(max_model_len=4096, engine_version="0.11.2", max_num_seqs=64)
    waterfall = plan_waterfall(QWEN2_7B, FITTED_CONSTANTS, launch, total_bytes=int(79.22 * GiB), total_source="test",
                               gpu_name="A100-80GB")
    assert next(t.bytes for t in waterfall.terms if t.name == "activation_peak") == 488_730_460


def test_each_release_and_sampler_takes_its_path() -> None:
    assert sampler_path(Version("0.6.3"), None, "flashinfer", 256) == SORT_V0
    assert sampler_path(Version("0.10.1.1"), "V0", "pytorch", 256) == SORT_V0
    assert sampler_path(Version("0.10.1.1"), None, "pytorch", 256) == SORT_V1
    assert sampler_path(Version("0.10.1.1"), None, "flashinfer", 256) == FLASHINFER
    assert sampler_path(Version("0.17.0"), None, "pytorch", 256) == TRITON
    assert sampler_path(Version("0.21.0"), None, "flashinfer", 256) == FLASHINFER
    assert sampler_path(Version("0.33.0"), None, "flashinfer", 256) == TRITON
    # Before 0.30 apply_top_k_top_p sorts a batch of fewer than 8 rows; from 0.30 Triton takes any batch.
    assert sampler_path(Version("0.28.0"), None, "pytorch", 4).path == "sort"
    assert sampler_path(Version("0.28.0"), None, "pytorch", 8) == TRITON
    assert sampler_path(Version("0.30.0"), None, "pytorch", 4) == TRITON


@pytest.fixture(scope="module")
def report():
    return run_field_check(CORPUS)


def test_corpus_cases_that_print_their_sampler_line_are_priced_on_that_lines_path(report) -> None:
    logged = [c for c in report.cases if c.sampler.source == "log" and c.launch.sampler_path is not None]
    assert len(logged) >= 5
    assert {c.sampler.name for c in logged} == {"flashinfer", "pytorch"}
    for case in logged:
        release, path = Version(case.release), case.launch.sampler_path
        assert path is not None
        if path.path == "greedy":  # the second runner's warm-up takes neither path
            assert release >= Version("0.22"), case.id
        elif release >= Version("0.22") or (case.sampler.name == "pytorch" and release >= Version("0.17")):
            assert path == TRITON, case.id
        else:
            assert path == (FLASHINFER if case.sampler.name == "flashinfer" else SORT_V1), case.id


def test_a_start_that_loaded_flashinfer_samples_with_it_where_its_release_takes_it_whenever_importable() -> None:
    # topk_topp_sampler.py: 0.9.0 … 0.11.0 take FlashInfer whenever it imports (at 0.2.3 or later) unless
    # VLLM_USE_FLASHINFER_SAMPLER=0; 0.8.5 disables it from FlashInfer 0.2.3; 0.11.1 makes it opt-in.
    loaded = {release: sampler_of_start(Version(release), None, flashinfer_loaded=True)
              for release in ("0.8.5", "0.9.0", "0.10.2", "0.11.0", "0.11.1", "0.12.0")}
    assert loaded == {"0.8.5": None, "0.9.0": "flashinfer", "0.10.2": "flashinfer", "0.11.0": "flashinfer",
                      "0.11.1": None, "0.12.0": None}
    assert sampler_of_start(Version("0.10.2"), None, flashinfer_loaded=False) is None
    assert sampler_of_start(Version("0.10.2"), "pytorch", flashinfer_loaded=True) == "pytorch"  # a line that says
    assert (release_default_sampler(Version("0.11.0")), release_default_sampler(Version("0.11.1"))) == (None, "pytorch")


def test_the_corpus_start_that_chose_flashinfer_attention_is_priced_on_its_sampler(report) -> None:
    # vllm#24577's A100 start of Qwen3-0.6B on 0.10.2 names FlashInfer's attention backend and no sampler line:
    # FlashInfer imported, so 0.10.2 sampled with it (14 B per logit, not the sort's fitted 36.71).
    case = next(c for c in report.cases if c.id == "v0102-qwen3-06b-a100-flashinfer-attn-len4096")
    assert (case.sampler.name, case.sampler.source, case.sampler.evidence) == (
        "flashinfer", "log", "Using FlashInfer backend on V1 engine.")
    assert case.launch.sampler_path == FLASHINFER
