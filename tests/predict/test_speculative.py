"""A drafter's layers in the KV cache, read from the start-up log the way vLLM printed them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.observe.server_logs import parse_startup_log
from harness.predict.budget import predict_capacity
from harness.predict.model_shape import load_model_shape
from harness.predict.speculative import SpeculativeDecoding, speculative_from_log, speculative_from_options

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
    assert speculative_from_log(None, None) is None  # a log that names no drafter


@pytest.mark.parametrize("tokens", [0, 65])
def test_a_logged_token_count_out_of_range_is_one_named_error(tokens) -> None:
    with pytest.raises(HarnessError, match=f"speculative method 'eagle3': {tokens} speculative tokens, not 1 to 64"):
        speculative_from_log("eagle3", tokens)


QWEN36_35B = LLAMA_31_8B.parent / "Qwen--Qwen3.6-35B-A3B.json"


def test_mtp_adds_the_models_own_draft_layer_to_a_hybrids_cache() -> None:
    # Qwen3.6-35B-A3B: 30 gated-delta-net state layers and 10 full-attention layers, 2 KV heads × 256 × K and V
    # × 2 B = 2,048 B a token each; mtp_num_hidden_layers 1 adds one more full-attention layer.
    # A state layer: conv 8,192 channels (2 × 16 × 128 + 32 × 128) × 3 past inputs × 2 B = 49,152 B and
    # 32 × 128 × 128 float32 = 2,097,152 B: 2,146,304 B, so one attention page must hold it:
    # 16 × ceil(2,146,304 / (16 × 2,048)) = 16 × 66 = 1,056 tokens a block, 1,056 × 2,048 = 2,162,688 B a page.
    # Without MTP: groups of 10 (30 < 1.5 × 10 is false): 3 state groups + 1 attention group, 10 pages a block
    # = 21,626,880 B; 10 GiB = 10,737,418,240 B // 21,626,880 = 496 blocks.
    # With MTP: 11 attention layers, groups of 11: still 4 groups, 11 pages a block = 23,789,568 B, the draft
    # layer's page more; the conv window holds one more input (65,536 B + 2,097,152 = 2,162,688 B, still
    # 66 × 32,768, so 1,056 tokens a block); 10,737,418,240 // 23,789,568 = 451 blocks.
    # A request of 8,192 tokens: ceil(8,192 / 1,056) = 8 attention blocks + 3 state groups × (1 + 1 speculative
    # token) = 14 blocks (11 without MTP); 451 // 4 groups × 1,056 = 118,272 tokens (vLLM 0.11.2's rule).
    shape = load_model_shape(str(QWEN36_35B))
    plain = predict_capacity(shape, available_kv_bytes=10 * 1024**3, block_size=16, max_model_len=8192)
    mtp = predict_capacity(shape, available_kv_bytes=10 * 1024**3, block_size=16, max_model_len=8192,
                           speculative=SpeculativeDecoding(method="mtp", num_speculative_tokens=1))
    assert (plain.block_size, plain.bytes_per_block, plain.num_blocks, plain.blocks_per_request) == (
        1_056, 21_626_880, 496, 11)
    assert (mtp.block_size, mtp.bytes_per_block, mtp.num_blocks, mtp.blocks_per_request) == (
        1_056, 23_789_568, 451, 14)
    assert mtp.bytes_per_block - plain.bytes_per_block == 1_056 * 2_048  # the draft layer's page
    assert mtp.kv_cache_tokens == 118_272


def test_options_build_the_one_drafter_value() -> None:
    assert speculative_from_options(None, None) is None
    assert speculative_from_options("eagle3", 3) == SpeculativeDecoding(method="eagle3", num_speculative_tokens=3)
    assert speculative_from_options("qwen3_next_mtp", 1) == SpeculativeDecoding(method="mtp",
                                                                                 num_speculative_tokens=1)


@pytest.mark.parametrize(
    ("method", "tokens", "named"),
    [
        ("draft_model", 3, "--speculative-method 'draft_model': its drafter's cache is not sized here"),
        ("mlp_speculator", 3, "--speculative-method 'mlp_speculator': its drafter's cache is not sized here"),
        ("mtp", 0, "--num-speculative-tokens: 0, not 1 to 64"),
        ("mtp", 65, "--num-speculative-tokens: 65, not 1 to 64"),
        ("mtp", None, "--speculative-method 'mtp': give --num-speculative-tokens"),
        (None, 2, "--num-speculative-tokens 2: give --speculative-method too"),
    ],
)
def test_a_bad_drafter_option_is_one_named_error(method, tokens, named) -> None:
    with pytest.raises(HarnessError, match=re.escape(named)):
        speculative_from_options(method, tokens)
