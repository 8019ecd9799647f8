"""The prefix-cache prediction: whole blocks only, the first of a group misses, the last prompt token is always
computed, and evictions are flagged once the run's blocks exceed the cache."""

from __future__ import annotations

import pytest

from harness.predict.prefix_cache import PromptSegment, SentPrompt, block_keys, predict_prefix_hits


def prompt(*segments: tuple[str, int], output: int = 0) -> SentPrompt:
    return SentPrompt(segments=[PromptSegment(key=k, tokens=n) for k, n in segments], output_tokens=output)


def test_only_whole_shared_blocks_hit_and_the_first_of_a_group_misses() -> None:
    # Block 16. Three prompts share a 40-token prefix, then bodies of 24: 40 // 16 = 2 whole blocks shared
    # (tokens 32-39 sit in a block with body tokens): the first misses, the other two hit 32 each.
    group = [prompt(("prefix", 40), (f"body{i}", 24)) for i in range(3)]
    prediction = predict_prefix_hits(group, 16)
    assert prediction.hit_tokens_by_request == [0, 32, 32]
    assert prediction.hit_tokens == 64 and prediction.queried_tokens == 3 * 64


def test_a_repeated_prompt_reuses_all_but_the_block_of_its_last_token() -> None:
    # 64 tokens = 4 whole blocks of 16, but the last token is always computed: (64 - 1) // 16 = 3 blocks hit.
    # At 65 tokens, (65 - 1) // 16 = 4 blocks: the fifth, partial block is never cached anyway.
    assert predict_prefix_hits([prompt(("a", 64)), prompt(("a", 64))], 16).hit_tokens_by_request == [0, 48]
    assert predict_prefix_hits([prompt(("a", 65)), prompt(("a", 65))], 16).hit_tokens_by_request == [0, 64]


def test_equal_segments_after_different_ones_share_nothing() -> None:
    # The second segments are equal, but a block's hash chains every block before it.
    sent = [prompt(("salt1", 8), ("prefix", 56)), prompt(("salt2", 8), ("prefix", 56))]
    assert predict_prefix_hits(sent, 16).hit_tokens == 0


def test_a_conversation_turn_reuses_the_turn_before_in_whole_blocks() -> None:
    # Turn 1: 40 tokens. Turn 2: turn 1's 40 + reply and message 50 = 90. Turn 3: turn 2's 90 + 30 = 120.
    # Block 16: turn 2 hits 40 // 16 = 2 blocks (32); turn 3 hits 90 // 16 = 5 blocks (80).
    turns = [prompt(("t1", 40)), prompt(("t1", 40), ("t2", 50)), prompt(("t1", 40), ("t2", 50), ("t3", 30))]
    assert predict_prefix_hits(turns, 16).hit_tokens_by_request == [0, 32, 80]


def test_blocks_needed_count_shared_blocks_once_and_flag_evictions() -> None:
    # Block 16, 3 prompts of 40 shared + 24 own = 64, 8 output tokens each: ceil(72 / 16) = 5 blocks each,
    # 15 in all; the second and third reuse 2 each: 15 - 4 = 11 blocks needed.
    group = [prompt(("prefix", 40), (f"body{i}", 24), output=8) for i in range(3)]
    assert predict_prefix_hits(group, 16, cache_blocks=11).eviction_possible is False
    assert predict_prefix_hits(group, 16, cache_blocks=10).eviction_possible is True
    assert predict_prefix_hits(group, 16).eviction_possible is None
    assert predict_prefix_hits(group, 16).blocks_needed == 11


def test_block_keys_cover_whole_blocks_only() -> None:
    # 40 + 24 = 64 tokens in blocks of 16: 4 whole blocks, the third ending 8 tokens into the body.
    keys = block_keys(prompt(("prefix", 40), ("body", 24)), 16)
    assert keys == [((), "prefix", 16), ((), "prefix", 32), (("prefix",), "body", 8), (("prefix",), "body", 24)]


def test_a_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="block size 0"):
        predict_prefix_hits([prompt(("a", 4))], 0)
