"""The field corpus's newer cases (issue 15): what each one adds is checked by hand from its own log."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pydantic
import pytest
import yaml

from harness.calibrate.field_check import check_logged, run_field_check
from harness.calibrate.field_corpus import load_corpus
from harness.calibrate.field_results import CaseResult, FieldReport, FigureCheck
from harness.errors import HarnessError
from harness.predict.model_shape import load_model_shape

CORPUS = Path(__file__).parents[1] / "fixtures" / "field"


@pytest.fixture(scope="module")
def report() -> FieldReport:
    return run_field_check(CORPUS)


def _case(report: FieldReport, case_id: str) -> CaseResult:
    return next(c for c in report.cases if c.id == case_id)


def _figure(case: CaseResult, name: str) -> FigureCheck:
    return next(f for f in case.logged.figures if f.name == name)


def _assert_exact_from_logged_memory(report: FieldReport, expected: dict[str, tuple[int, float]]) -> None:
    """Each case is exact from its logged memory, with the KV tokens and concurrency its log prints."""
    for case_id, (tokens, concurrency) in expected.items():
        case = _case(report, case_id)
        assert case.logged.status == "exact"
        assert (_figure(case, "kv_cache_tokens").logged, _figure(case, "max_concurrency").logged) == (tokens,
                                                                                                      concurrency)


def test_the_corpus_holds_at_least_thirty_starts() -> None:
    cases, _ = load_corpus(CORPUS)
    assert len(cases) >= 30


def test_no_start_is_in_the_corpus_twice() -> None:
    """A start kept as two cases would count twice: two cases of one source file (at any commit) that score the
    same start may share no capacity line, timestamp and all."""
    cases, _ = load_corpus(CORPUS)
    capacity = re.compile(r"KV cache memory|KV cache size|blocks: |Maximum concurrency|reserved for KV Cache")
    seen: dict[tuple[str, int | None], list[tuple[str, set[str]]]] = {}
    compared = 0
    for case in cases:
        file = re.sub(r"/blob/[0-9a-f]{40}/", "/blob/", str(case.source))
        lines = {line.strip() for line in case.log.splitlines() if capacity.search(line)}
        for other, other_lines in seen.setdefault((file, case.start), []):
            assert not lines & other_lines, f"{case.id} and {other} hold the same start of {file}"
            compared += 1
        seen[(file, case.start)].append((case.id, lines))
    assert compared > 0  # files with several cases (llm-compressor's logs, a sweep's) were held against each other


def test_awq_qwen25_14b_blocks_by_hand(report) -> None:
    # 48 layers × (K, V) × 8 KV heads × 128 × 2 B (float16) × 16 tokens = 3,145,728 B per block; AWQ weights do
    # not change the cache. "10.39 GiB" is 10.385 … 10.395 GiB: 3,544.7 … 3,548.2 blocks, so 3,544 … 3,548,
    # 56,704 … 56,768 tokens; the log's 56,736 tokens are 3,546 blocks.
    case = _case(report, "v013-qwen25-14b-awq-len8192")
    tokens = _figure(case, "kv_cache_tokens")
    assert (tokens.predicted_low, tokens.predicted_high, tokens.logged) == (56_704, 56_768, 56_736)
    assert case.logged.status == "exact"


def test_gpt_oss_20b_two_groups_by_hand(report) -> None:
    # 24 layers, sliding and full in turn: two groups of 12 layers share one block of 12 pages, each page
    # 16 tokens × (K, V) × 8 KV heads × 64 × 2 B = 32,768 B, so 393,216 B per block. "12.94 GiB" is
    # 12.935 … 12.945 GiB: 35,320 … 35,348 blocks; tokens are blocks // 2 groups × 16 = 282,560 … 282,784
    # (logged 282,624). One request of 8,192 tokens takes 512 full-attention blocks and
    # ceil((128 - 1 + 2,048) / 16) + 1 = 137 sliding-window blocks: 649, so 54.42 … 54.47x (logged 54.44x).
    case = _case(report, "v013-gpt-oss-20b-gb10-util025")
    tokens, concurrency = _figure(case, "kv_cache_tokens"), _figure(case, "max_concurrency")
    assert (tokens.predicted_low, tokens.predicted_high) == (282_560, 282_784)
    assert (concurrency.predicted_low, concurrency.predicted_high) == (54.42, 54.47)
    assert case.logged.status == "exact"


def test_refused_v1_start_is_priced_from_its_own_request(report) -> None:
    # Llama-3.1-8B: 32 layers × (K, V) × 8 KV heads × 128 × 2 B = 128 KiB per token; 131,072 tokens = 16.00 GiB,
    # the figure the refusal prints beside its 4.92 GiB.
    case = _case(report, "v0100-llama31-8b-len131072-fails")
    needed = _figure(case, "kv_gib_needed_per_request")
    assert (needed.predicted_low, needed.logged) == (16.0, 16.0)
    assert case.logged.fits is False and not case.cache_fit


def test_cases_without_a_config_are_listed_not_scored(report) -> None:
    cases, _ = load_corpus(CORPUS)
    without = [case.id for case in cases if case.facts.config is None]
    assert without
    for case_id in without:
        case = _case(report, case_id)
        assert case.logged.status == "no config for this model"
        assert case.launch.status == "no config for this model"


def test_qwen36_35b_hybrid_cases_are_exact_from_their_logged_memory(report) -> None:
    # Worked by hand in tests/predict/test_budget.py: 0.19.2's blocks // groups × block size (623,040 tokens),
    # 0.24.0's fp8 KV with prefix caching (300 blocks / 69 a request = 4.35x, 569,878 tokens) and 0.25.1's
    # MTP drafting 3 tokens (3,300 blocks / 257 a request = 12.84x, 3,366,051 tokens).
    expected = {"v0192-qwen36-35b-a3b-bf16-gb10-len131072": (623_040, 18.44),
                "v024-qwen36-35b-a3b-rtx5090-fp8kv": (569_878, 4.35),
                "v0251-qwen36-35b-a3b-nvfp4-mtp-gb10-len262144": (3_366_051, 12.84)}
    _assert_exact_from_logged_memory(report, expected)


def test_qwen_27b_dense_hybrid_cases_are_exact_from_their_logged_memory(report) -> None:
    # The dense hybrid of 48 gated-delta-net and 16 attention layers (Qwen3.6-27B's config, Qwen3.8-27B's the
    # same): 0.27.1's two committed logs, two ranks of 44.73 GiB at 65,536 tokens and one GPU of 41.03 GiB at
    # 4,096, and 0.25.1's 80.17 GiB with MTP drafting 3 tokens (one more attention layer) at 262,144.
    expected = {"v0271-qwen36-27b-hybrid-tp2-len65536": (1_407_894, 21.48),
                "v0271-qwen36-27b-fp8-hybrid-len4096-util088": (292_522, 71.42),
                "v0251-qwen38-27b-int4-mtp-gb10-len262144": (1_191_213, 4.54)}
    _assert_exact_from_logged_memory(report, expected)


def test_speculative_facts_name_mtp_and_nothing_else() -> None:
    cases, _ = load_corpus(CORPUS)
    mtp = next(c for c in cases if c.id == "v0251-qwen36-35b-a3b-nvfp4-mtp-gb10-len262144")
    assert mtp.facts.speculative is not None and mtp.facts.speculative.num_speculative_tokens == 3
    facts = mtp.facts.model_dump()
    for bad in ({"method": "dflash", "num_speculative_tokens": 3}, {"method": "mtp", "num_speculative_tokens": 0},
                {"method": "mtp", "num_speculative_tokens": 3, "draft_model": "x"}):
        with pytest.raises(pydantic.ValidationError):
            type(mtp.facts)(**{**facts, "speculative": bad})


def test_a_threads_multimodal_limits_reach_the_encoders_profile_and_nothing_else_is_taken() -> None:
    cases, _ = load_corpus(CORPUS)
    case = next(c for c in cases if c.id == "v083-qwen25-vl-72b-a100-40gb-tp4-v0-fails")
    assert case.facts.limit_mm_per_prompt == {"image": 1, "video": 0}
    facts = case.facts.model_dump()
    for bad in ({"image": -1}, {"audio": 1}, {"image": "many"}):
        with pytest.raises(pydantic.ValidationError):
            type(case.facts)(**{**facts, "limit_mm_per_prompt": bad})


def test_a_case_whose_log_holds_several_starts_names_the_one_it_scores(report) -> None:
    # The 29k case's source comment posts the 20k start's block first; given both blocks, the case must say which
    # start it scores, and scoring start 2 gives the very figures the 29k case gets from its own block.
    two_starts = (Path(__file__).parents[1] / "fixtures" / "logs" / "issue-10517-two-starts.log").read_text()
    cases, _ = load_corpus(CORPUS)
    alone = next(c for c in cases if c.id == "v064-llama31-8b-rtx3090-len29000-fails")
    fields = alone.model_dump(exclude={"id", "log", "start"})
    with pytest.raises(pydantic.ValidationError, match="the log holds 2 starts: name the one the case scores"):
        type(alone)(id="both", log=two_starts, **fields)
    with pytest.raises(pydantic.ValidationError, match="'start: 3' but the log holds 2 start"):
        type(alone)(id="both", log=two_starts, start=3, **fields)
    both = type(alone)(id="both", log=two_starts, start=2, **fields)
    shape = load_model_shape(str(CORPUS / "configs" / "meta-llama--Llama-3.1-8B-Instruct.json"))
    assert check_logged(both, shape) == check_logged(alone, shape) == _case(report, alone.id).logged
    assert both.parsed().kv_cache_tokens_at_failure == 23648


def test_a_case_whose_log_serves_lora_adapters_must_say_so() -> None:
    # Unstated, the LoRA start would be scored before launch against a waterfall that leaves its adapters out.
    cases, _ = load_corpus(CORPUS)
    lora = next(c for c in cases if c.id == "v0220-qwen3-8b-t4-tp2-lora-eager-len8192")
    fields = {"source": str(lora.source), "where": lora.where, "edits": lora.edits, "log": lora.log}
    unstated = lora.facts.model_dump(exclude={"enable_lora"})
    with pytest.raises(pydantic.ValidationError, match=r"serves LoRA adapters \('Using PunicaWrapperGPU\.'\)"):
        type(lora)(id="unstated", facts=unstated, **fields)
    assert type(lora)(id="stated", facts={**unstated, "enable_lora": True}, **fields).facts.enable_lora


def test_a_case_that_states_no_tensor_parallel_size_takes_the_one_its_log_shows() -> None:
    # A two-GPU log pasted without its engine config line: workers TP0 and TP1 each print their KV memory,
    # so the case is scored on 2 GPUs; a thread that states a size keeps it, and a log with no rank means 1.
    cases, _ = load_corpus(CORPUS)
    tp2 = next(c for c in cases if c.id == "v0101-qwen2-7b-a100-tp2-util05")
    ranks_only = "\n".join(line for line in tp2.log.splitlines() if "VllmWorker TP" in line or "EngineCore" in line)
    facts = tp2.facts.model_dump(exclude={"tensor_parallel_size"})
    fields = {"source": str(tp2.source), "where": tp2.where, "edits": tp2.edits}
    found = type(tp2)(id="ranks", log=ranks_only, facts=facts, **fields)
    assert found.facts.tensor_parallel_size == 2
    stated = type(tp2)(id="stated", log=ranks_only, facts={**facts, "tensor_parallel_size": 4}, **fields)
    assert stated.facts.tensor_parallel_size == 4
    one_gpu = "\n".join(line.split(") ", 1)[1] for line in ranks_only.splitlines())  # the process prefixes cut
    assert type(tp2)(id="one", log=one_gpu, facts=facts, **fields).facts.tensor_parallel_size == 1



def test_a_config_whose_architecture_is_refused_is_named_on_its_case_and_the_rest_is_scored(tmp_path: Path) -> None:
    copy = tmp_path / "field"
    shutil.copytree(CORPUS, copy)
    qwen2 = json.loads((copy / "configs" / "Qwen--Qwen2-7B-Instruct.json").read_text())
    mllama = {**qwen2, "architectures": ["MllamaForConditionalGeneration"]}
    (copy / "configs" / "meta-llama--Llama-3.2-11B-Vision-Instruct.json").write_text(json.dumps(mllama))
    case_file = copy / "cases" / "v070-llama32-11b-vision-h100-len65536.yaml"
    case = yaml.safe_load(case_file.read_text())
    case["facts"]["config"] = "meta-llama--Llama-3.2-11B-Vision-Instruct.json"
    case_file.write_text(yaml.safe_dump(case, allow_unicode=True))
    report = run_field_check(copy)
    refused = _case(report, "v070-llama32-11b-vision-h100-len65536")
    for status in (refused.logged.status, refused.launch.status):
        assert status.startswith("not modelled: ") and "MllamaForConditionalGeneration is refused" in status
    assert _case(report, "v0101-qwen2-7b-a100-util05").logged.status == "exact"


@pytest.mark.parametrize(("damage", "reason"), [
    (b"\xff\xfe{", "UnicodeDecodeError"), (b"[" * 100_000, "RecursionError"), (b'{"hidden_size": ', "JSONDecodeError"),
])
def test_a_config_that_cannot_be_read_is_named_with_the_case_that_names_it(tmp_path: Path, damage: bytes,
                                                                           reason: str) -> None:
    copy = tmp_path / "field"
    shutil.copytree(CORPUS, copy)
    (copy / "configs" / "Qwen--Qwen2-7B-Instruct.json").write_bytes(damage)
    with pytest.raises(HarnessError, match=rf"Qwen--Qwen2-7B-Instruct\.json: config named by case v0101-qwen2-7b-\S+ "
                                           rf"cannot be read \({reason}\)"):
        run_field_check(copy)
