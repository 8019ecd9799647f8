"""Which GPU model runner each release gives a model by default, as vllm/config/vllm.py decides it."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.version import Version

from harness.calibrate.field_corpus import load_corpus
from harness.calibrate.field_launch import engine_launch
from harness.predict.memory_model import second_runner
from harness.predict.model_runner import runs_second_runner
from harness.predict.parameter_count import model_size
from harness.predict.speculative import SpeculativeDecoding

CORPUS = Path(__file__).parents[1] / "fixtures" / "field"


def second(version: str, architecture: str, moe: bool = False, quantized: bool = False,
           speculative: str | None = None) -> bool:
    drafter = None if speculative is None else SpeculativeDecoding(method=speculative, num_speculative_tokens=2)
    return runs_second_runner(Version(version), architecture, moe, quantized, drafter)


def test_the_second_runner_reaches_more_models_release_by_release() -> None:
    # 0.21 has no default second runner; 0.22 names Qwen3, 0.23 Llama and Mistral too, unquantized and dense
    assert not second("0.21.0", "Qwen3ForCausalLM")
    assert second("0.22.0", "Qwen3ForCausalLM") and not second("0.22.0", "LlamaForCausalLM")
    assert second("0.23.0", "LlamaForCausalLM") and not second("0.23.0", "LlamaForCausalLM", quantized=True)
    assert not second("0.23.0", "Qwen2ForCausalLM")
    # 0.24 drops the quantization test and names three MoE families
    assert second("0.24.0", "LlamaForCausalLM", quantized=True) and second("0.24.0", "Qwen2MoeForCausalLM", moe=True)
    assert not second("0.24.0", "Qwen2ForCausalLM")
    # 0.25-0.28: any dense model, not a hybrid, not an MoE model outside the named ones
    assert second("0.25.0", "Qwen2ForCausalLM") and second("0.28.0", "Gemma3ForCausalLM")
    assert not second("0.28.0", "Qwen3MoeForCausalLM", moe=True)
    assert not second("0.28.0", "Qwen3_5ForConditionalGeneration")
    assert second("0.28.0", "DeepseekV2ForCausalLM", moe=True)
    # 0.29 gives it every model
    assert second("0.29.0", "Qwen3MoeForCausalLM", moe=True) and second("0.29.0", "Qwen3NextForCausalLM", moe=True)


def test_a_speculator_the_second_runner_lacks_keeps_the_first() -> None:
    assert second("0.29.0", "LlamaForCausalLM", speculative="eagle3")
    assert second("0.29.0", "Qwen3_5ForConditionalGeneration", speculative="mtp")
    assert not second("0.29.0", "LlamaForCausalLM", speculative="ngram")
    assert not second("0.29.0", "LlamaForCausalLM", speculative="medusa")


POOLING = {"v0220-qwen3-embedding-8b-util018-sleep", "v0220-qwen3-embedding-8b-util035"}  # Qwen3-Embedding: pools
LOADED_BY = re.compile(r"\[(gpu_model_runner|model_runner)\.py:\d+\] Model loading took")


def test_the_rule_agrees_with_the_runner_each_corpus_log_names() -> None:
    # From 0.22 a V1 log names the runner that loaded the weights: `[gpu_model_runner.py:…] Model loading took` is
    # the first, `[model_runner.py:…]` the second (vllm/v1/worker/gpu/model_runner.py). Read from each corpus start
    # that prints it, with its config and launch as the field check reads them, the rule must name the same one.
    # The two Qwen3-Embedding starts pool, which no choice for a generating model covers.
    cases, configs = load_corpus(CORPUS)
    checked = []
    for case in cases:
        loaded = LOADED_BY.search(case.log)
        config = configs.get(case.facts.config or "")
        if loaded is None or config is None or case.id in POOLING or Version(case.facts.vllm_version) < Version("0.22"):
            continue
        version = Version(case.facts.vllm_version)
        assert second_runner(config, model_size(config), version, engine_launch(case)) == (
            loaded.group(1) == "model_runner"), case.id
        checked.append(loaded.group(1))
    assert checked.count("model_runner") >= 4 and checked.count("gpu_model_runner") >= 4
