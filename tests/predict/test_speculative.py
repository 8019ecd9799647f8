"""A drafter's layers in the KV cache, read from the start-up log the way vLLM printed them."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.observe.server_logs import parse_startup_log
from harness.predict.budget import predict_capacity
from harness.predict.model_shape import load_model_shape
from harness.predict.speculative import SpeculativeDecoding, speculative_from_log

LLAMA_31_8B = Path(__file__).parents[1] / "fixtures" / "field" / "configs" / "meta-llama--Llama-3.1-8B-Instruct.json"
# An engine config line in the form V1 prints with a drafter (SpeculativeConfig(method=…, model=…,
# num_spec_tokens=…) between the model and the tokenizer), for the drafter of vllm#24505's command.
EAGLE_LINE = ("INFO 09-09 05:20:11 [core.py:75] Initializing a V1 LLM engine (v0.10.1.1) with config: "
              "model='meta-llama/Llama-3.1-8B-Instruct', speculative_config=SpeculativeConfig(method='eagle3', "
              "model='yuhuili/EAGLE3-LLaMA3.1-Instruct-8B', num_spec_tokens=2), "
              "tokenizer='meta-llama/Llama-3.1-8B-Instruct', skip_tokenizer_init=False, tensor_parallel_size=1, ")


def test_the_engine_line_names_the_drafter_and_its_tokens_not_the_target_model() -> None:
    log = parse_startup_log(EAGLE_LINE)
    assert (log.speculative_method, log.speculative_tokens) == ("eagle3", 2)
    assert log.model == "meta-llama/Llama-3.1-8B-Instruct"  # the drafter's model= is not the served model


def test_the_arguments_dict_names_the_drafter_when_the_engine_line_does_not() -> None:
    log = parse_startup_log("INFO 07-25 13:41:23 [api_utils.py:339] non-default args: {'model': 'x', "
                            "'speculative_config': {'method': 'mtp', 'num_speculative_tokens': 2}}")
    assert (log.speculative_method, log.speculative_tokens) == ("mtp", 2)


def test_an_eagle_head_adds_one_layer_of_the_targets_layout() -> None:
    shape = load_model_shape(str(LLAMA_31_8B))
    # Llama-3.1-8B: 32 layers × K and V × 8 heads × 128 × 2 B = 131,072 B a token, 2,097,152 B a block of 16;
    # 10 GiB = 10,737,418,240 B hold 5,120 blocks, 81,920 tokens. The EAGLE-3 head's layer makes it 33 layers:
    # 2,162,688 B a block, 10,737,418,240 // 2,162,688 = 4,964 blocks, 79,424 tokens.
    plain = predict_capacity(shape, available_kv_bytes=10 * 1024**3, block_size=16, max_model_len=8192)
    eagle = predict_capacity(shape, available_kv_bytes=10 * 1024**3, block_size=16, max_model_len=8192,
                             speculative=SpeculativeDecoding(method="eagle3", num_speculative_tokens=2))
    assert (plain.num_blocks, plain.kv_cache_tokens) == (5_120, 81_920)
    assert (eagle.bytes_per_block, eagle.num_blocks, eagle.kv_cache_tokens) == (2_162_688, 4_964, 79_424)
    ngram = predict_capacity(shape, available_kv_bytes=10 * 1024**3, block_size=16, max_model_len=8192,
                             speculative=SpeculativeDecoding(method="ngram", num_speculative_tokens=4))
    assert ngram.num_blocks == plain.num_blocks  # n-gram drafting keeps no cache


def test_a_separate_draft_model_is_refused_by_name() -> None:
    with pytest.raises(HarnessError, match="speculative method 'draft_model': its drafter's cache is not sized here"):
        speculative_from_log("draft_model", 3)


def test_a_models_own_mtp_under_its_older_name_is_mtp() -> None:
    assert speculative_from_log("deepseek_mtp", 1) == SpeculativeDecoding(method="mtp", num_speculative_tokens=1)


@pytest.mark.parametrize("tokens", [0, 65])
def test_a_logged_token_count_out_of_range_is_one_named_error(tokens) -> None:
    with pytest.raises(HarnessError, match=f"speculative method 'eagle3': {tokens} speculative tokens, not 1 to 64"):
        speculative_from_log("eagle3", tokens)
