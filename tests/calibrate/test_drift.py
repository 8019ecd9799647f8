"""Drift at record time, on real start-up logs (tests/fixtures/field): each case's log as a run would record it,
its facts as the engine's limits and its GPU as device.json would give it."""

from __future__ import annotations

from pathlib import Path

from harness.measure.figures import read_run_figures
from harness.observe.capacity_report import CapacityReport
from harness.observe.drift import DriftCheck, DriftTerm, judge
from harness.schema import RunFile
from harness.units import GiB

from run_records import field_drift, write_run


def test_a_start_off_by_more_than_two_percent_names_the_term_its_log_shows_off() -> None:
    """Qwen2.5-14B, TP=2 on two GPUs of 39.50 GiB (0.7.2, V0, fp16): the log states every term. Before launch,
    non-torch is 0.129 fitted + 0.04 NCCL + 16 MiB custom all-reduce = 0.18 GiB against 1.54 logged, the
    largest miss that leaves too much KV memory (the activation peak, 2.83 predicted vs 2.84 logged, leans the
    same way by less; the weights, 13.95 vs 13.93, the other). The weights are 13.75 GiB of parameters, the RoPE
    cache, 131,072 positions × 128 dims × 2 B = 32 MiB, and the allocator's slack, 3.5 MiB a layer (each rank's
    QKV 35 MiB, o_proj 25 MiB and gate_up 135 MiB blocks rounded up 1 MiB, down's 67.5 MiB 0.5) × 48 = 168 MiB:
    14,978,908,160 B. The activation peak: V0's forward over 32,768 tokens, 46,336 values a token × 2 B =
    3,036,676,096 B (test_activation.py). KV: 38,171,521,843 B usable (39.50 GiB × 0.9) − 14,978,908,160 −
    3,036,676,096 − 198,239,583 = 19,957,698,004 B (18.59 GiB); at 48 layers × 2 × 4 heads per rank × 128 × 2 B =
    96 KiB per token, 1.5 MiB per block of 16: 12,688 blocks = 203,008 tokens, against 11,770 logged blocks =
    188,320 tokens: 188,320 / 203,008 − 1 = −7.2%, over the 2% threshold."""
    check = field_drift("v072-qwen25-14b-tp2-fp16")
    assert isinstance(check, DriftCheck), check
    assert (check.kv_cache_tokens_predicted, check.kv_cache_tokens_logged) == (203_008, 188_320)
    assert check.kv_cache_tokens_drift_share == -0.072352  # 188,320 / 203,008 − 1, rounded to 6 places
    assert check.term_off == "non_torch" and check.unstated_terms == []
    non_torch = next(term for term in check.terms if term.name == "non_torch")
    assert non_torch.logged_bytes is not None
    assert (round(non_torch.predicted_bytes / GiB, 2), round(non_torch.logged_bytes / GiB, 2)) == (0.18, 1.54)
    assert check.qualification is not None
    assert "-7.2%" in check.qualification and "non_torch most likely off (0.18 GiB predicted, 1.54 GiB " \
        "logged)" in check.qualification


def test_a_start_within_two_percent_is_not_qualified() -> None:
    """Qwen3-0.6B on one H100 (79.19 GiB logged, 0.9.2 V0, util 0.8, 8 sequences): 68,023,692,033 B usable −
    1,202,454,528 weights (1.11 GiB of parameters and a RoPE cache of 40,960 positions × 128 dims × 2 B = 10 MiB)
    − 218,103,808 activation (V0's forward over 8,192 tokens: Qwen2MLP keeps gate_up, 3 × 1,024 + 3,072 + 1,024 +
    6,144 = 13,312 values a token × 2 B) − 138,512,695 non-torch (the base, int(0.129 × 2³⁰): the log gives a
    total, not the GPU's name) = 66,464,621,002 B (61.90 GiB) predicted against 61.84 logged; at 28 layers × 2 × 8
    heads × 128 × 2 B = 112 KiB per token, 579,525.5 tokens, 36,220 blocks of 16 = 579,520 tokens predicted
    against 36,184 blocks × 16 = 578,944 logged: −0.10%."""
    check = field_drift("v09-qwen3-06b-v0-util08")
    assert isinstance(check, DriftCheck), check
    assert (check.kv_cache_tokens_predicted, check.kv_cache_tokens_logged) == (579_520, 578_944)
    assert check.kv_cache_tokens_drift_share == -0.000994  # 578,944 / 579,520 − 1, rounded to 6 places
    assert check.qualification is None and check.term_off is None


def test_a_start_served_in_float32_is_priced_in_four_bytes_not_the_configs_two() -> None:
    """The same Qwen3-0.6B start as above, its log saying dtype=float32 (--dtype float32 over a bfloat16 config):
    vLLM then holds the weights, the activations and an 'auto' KV cache in 4 B. Weights: 595,984,384 parameters
    × 4 B = 2,383,937,536, + 0.5 MiB the allocator rounds the large blocks up to (524,288) + the RoPE cache,
    40,960 × 128 × 4 B = 20,971,520: 2,405,433,344 B. The activation peak doubles, 218,103,808 → 436,207,616.
    KV: 68,023,692,033 usable − 2,405,433,344 − 436,207,616 − 138,512,695 = 65,043,538,378 B; at 28 layers × 2 ×
    8 heads × 128 × 4 B = 229,376 B per token, 283,567.3 tokens, 17,722 blocks of 16 = 283,552 tokens."""
    check = field_drift("v09-qwen3-06b-v0-util08", dtype="float32")
    assert isinstance(check, DriftCheck), check
    predicted = {term.name: term.predicted_bytes for term in check.terms}
    assert predicted["weights"] == 2_405_433_344 and predicted["activation_peak"] == 436_207_616
    assert predicted["kv_memory"] == 65_043_538_378
    assert check.kv_cache_tokens_predicted == 283_552


def test_a_log_without_a_profile_says_which_terms_it_does_not_state() -> None:
    """Qwen2.5-7B-Instruct in fp16 and eager on a V100-32GB, vLLM 0.18.0 at util 0.9: the log states the weights
    (14.25 GiB, 15,300,820,992 B logged against 15,298,723,840 predicted, 2 MiB apart) and the KV memory, not the
    activation peak nor non-torch memory; eager, it captures no graphs. 245,360 tokens logged against 255,920
    predicted drift by −4.1%, which the weights' 2 MiB cannot explain, so the qualification names the two
    unstated terms."""
    check = field_drift("v0180-qwen25-7b-v100-fp16-eager")
    assert isinstance(check, DriftCheck), check
    assert check.kv_cache_tokens_drift_share == -0.041263  # 245,360 / 255,920 − 1, rounded to 6 places
    assert check.term_off is None and check.unstated_terms == ["activation_peak", "non_torch"]
    assert check.qualification is not None
    assert check.qualification.endswith("the log does not state activation_peak, non_torch: the term off is among "
                                        "them, or the GPU's total")


def test_a_drifted_record_is_qualified_in_its_outputs_beside_the_summarys_own(tmp_path: Path) -> None:
    """The record keeps the check in capacity.json; the figures contract joins its qualification to the
    summary's and gives each term as an output, so the dashboard and the report show them per run UUID."""
    check = field_drift("v072-qwen25-14b-tp2-fp16")
    assert isinstance(check, DriftCheck) and check.qualification is not None
    run_dir = write_run(tmp_path)
    capacity = run_dir / RunFile.CAPACITY
    report = CapacityReport.model_validate_json(capacity.read_text())
    capacity.write_text(report.model_copy(update={"drift": check}).model_dump_json())
    figures = read_run_figures(run_dir)
    assert figures.summary is not None
    outputs = figures.outputs()
    assert outputs["qualifications"] == "; ".join([*figures.summary.qualifications, check.qualification])
    assert outputs["drift_term"] == "non_torch" and outputs["kv_cache_tokens_before_launch"] == 203_008
    assert outputs["non_torch_bytes_logged"] == round(1.54 * GiB)  # as printed: 1.54 GiB
    assert outputs["cuda_graphs_bytes_logged"] == round(0.28 * GiB)  # "Graph capturing finished ... took 0.28 GiB"


def test_a_term_the_log_does_not_state_has_no_output_not_a_zero(tmp_path: Path) -> None:
    """Qwen2.5-32B on two L40S (0.7.3): the profile states weights, activation and non-torch memory but no graph
    memory, so the record's outputs carry no graph figure rather than a zero."""
    check = field_drift("v07-qwen25-32b-l40s-tp2")
    assert isinstance(check, DriftCheck), check
    run_dir = write_run(tmp_path)
    capacity = run_dir / RunFile.CAPACITY
    report = CapacityReport.model_validate_json(capacity.read_text())
    capacity.write_text(report.model_copy(update={"drift": check}).model_dump_json())
    outputs = read_run_figures(run_dir).outputs()
    assert outputs["non_torch_bytes_logged"] == round(0.30 * GiB)  # as printed: 0.30 GiB
    assert "cuda_graphs_bytes_logged" not in outputs


def test_a_term_that_explains_part_of_the_gap_leaves_the_rest_to_the_unstated_ones() -> None:
    """Qwen3-30B-A3B in 4-bit AWQ on an RTX 3090 (23.69 GiB, 0.10.0, util 0.8, 2,048 batched tokens):
    20,349,555,048 B usable (int(23.69 × 2³⁰) × 0.8) − 16,812,736,512 weights − 1,436,246,671 activation −
    138,512,695 non-torch = 1,962,059,170 B (1.83 GiB) predicted, 1.92 logged, a 0.09 GiB gap; the weights are logged
    at 15.61 GiB, 0.05 below the prediction (15.66), which leans the right way but 0.05 < 0.8 × 0.09, so the rest is
    put to the activation peak and non-torch memory, which the log does not state. Tokens: 1,962,059,170 B over 48
    layers × 2 × 4 heads × 128 × 2 B = 96 KiB a token, 1.5 MiB a block of 16, are 1,247 whole blocks = 19,952
    tokens, against 20,960 logged: +5.1%, over the threshold."""
    check = field_drift("v0100-qwen3-30b-a3b-awq-rtx3090-len2048")
    assert isinstance(check, DriftCheck), check
    assert (check.kv_cache_tokens_predicted, check.kv_cache_tokens_logged) == (19_952, 20_960)
    assert check.term_off == "weights" and check.qualification is not None
    assert check.qualification.endswith(
        "weights most likely off (15.66 GiB predicted, 15.61 GiB logged), which accounts for 0.05 GiB of the "
        "0.09 GiB KV memory gap; the rest lies in what the log does not state (activation_peak, non_torch)")


def test_a_prediction_that_leaves_no_cache_is_qualified_without_a_share() -> None:
    """Before launch nothing was left for the cache, yet the engine logged 4,096 tokens: there is no share of
    nothing, so the share is None (a JSON record cannot hold an infinity) and the qualification says it in words;
    the weights predicted 2 GiB above the logged are the term that leans that way."""
    terms = [DriftTerm(name="weights", predicted_bytes=10 * GiB, logged_bytes=8 * GiB),
             DriftTerm(name="kv_memory", predicted_bytes=0, logged_bytes=GiB // 2)]
    check = judge("gpu waterfall", 80 * GiB, 0, 4096, terms)
    assert check.kv_cache_tokens_drift_share is None and check.term_off == "weights"
    assert check.qualification == ("the before-launch prediction leaves no KV cache, the engine logged 4,096 tokens: "
                                   "weights most likely off (10.00 GiB predicted, 8.00 GiB logged)")
    assert DriftCheck.model_validate_json(check.model_dump_json()) == check  # the record reads back


def test_a_logged_mtp_drafter_is_priced_in_the_drift_check_too() -> None:
    """Qwen3.6-35B-A3B on a GB10, as logged (no drafter) and as if its log named MTP with one speculative token.
    The drafter's weights are one full-attention decoder layer of the target's, 836,241,408 parameters, and its
    fc, 2 × 2,048 × 2,048 = 8,388,608, at 2 B: 1,689,260,032 B subtracted before the cache, which then also
    holds the drafter's layer, so fewer tokens are predicted."""
    plain = field_drift("v0192-qwen36-35b-a3b-bf16-gb10-len131072")
    drafted = field_drift("v0192-qwen36-35b-a3b-bf16-gb10-len131072", speculative_method="mtp", speculative_tokens=1)
    assert isinstance(plain, DriftCheck) and isinstance(drafted, DriftCheck), (plain, drafted)
    assert "drafter_weights" not in {term.name for term in plain.terms}
    drafter = next(term for term in drafted.terms if term.name == "drafter_weights")
    assert drafter.predicted_bytes == 1_689_260_032 and drafter.logged_bytes is None
    assert drafted.kv_cache_tokens_predicted < plain.kv_cache_tokens_predicted


def test_the_sampler_a_run_log_names_prices_its_activation_peak() -> None:
    """Qwen2-7B over two A100-80GBs on 0.10.1.1 at 0.25 utilisation, whose workers print "Using FlashInfer for
    top-p & top-k sampling.". An A100 keeps V1's small defaults: 2,048 profiled tokens, 256 sampled rows of the
    152,064-entry vocabulary, 38,928,384 logits. With the log's FlashInfer sampler at 14 B per logit the peak is
    2,048 × 3,584 × 2 B = 14,680,064 B of hidden states + 544,997,376 = 559,677,440 B, and the prediction lands
    within the threshold (448,848 tokens against 450,192 logged). Read as the sort (36.71 B per logit:
    1,429,060,976 B) it would be 1,443,741,040 B, 0.82 GiB more, and the run would be qualified at +7.7%."""
    def activation(check: DriftCheck) -> int:
        return next(term.predicted_bytes for term in check.terms if term.name == "activation_peak")

    named = field_drift("v0101-qwen2-7b-a100-tp2-util025")
    assert isinstance(named, DriftCheck), named
    assert activation(named) == 559_677_440 and named.qualification is None
    assert (named.kv_cache_tokens_predicted, named.kv_cache_tokens_logged) == (448_848, 450_192)
    unnamed = field_drift("v0101-qwen2-7b-a100-tp2-util025", top_k_top_p_sampler=None)
    assert isinstance(unnamed, DriftCheck), unnamed
    assert activation(unnamed) == 1_443_741_040
    assert unnamed.qualification is not None and "+7.7%" in unnamed.qualification


def test_a_start_serving_lora_adapters_is_not_judged_against_a_prediction_that_leaves_them_out() -> None:
    # Qwen3-8B over two T4s on 0.22.0 with LoRA ("Using PunicaWrapperGPU."): the adapters' slots and the profile's
    # dummy adapters are not priced, so a drift verdict would blame a term for what the model never sized. The same
    # start read without that line is judged.
    lora = field_drift("v0220-qwen3-8b-t4-tp2-lora-eager-len8192")
    assert lora == ("no drift check: the engine serves LoRA adapters (their slots and the profile's dummy adapters "
                    "are not sized here), as its line says: 'Using PunicaWrapperGPU.'")
    assert isinstance(field_drift("v0220-qwen3-8b-t4-tp2-lora-eager-len8192", lora_adapters_line=None), DriftCheck)
