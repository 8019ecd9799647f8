"""Inventories a prefix cache can reuse: groups sharing a prefix and conversations, frozen and rebuilt
byte-identically, and the segments the prediction reads from them."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from harness.inventory.build import rebuild, salted
from harness.inventory.frozen import load_inventory, write_inventory
from harness.inventory.prefix_groups import (
    Conversation,
    ConversationTurn,
    build_conversation_inventory,
    build_prefix_group_inventory,
    conversation_prompts,
)
from harness.inventory.recipe import SALT_TOKENS, VocabularyRange
from harness.inventory.segments import prompt_segments, sent_prompts
from harness.inventory.workload_recipes import ConversationRecipe, PrefixGroupRecipe, TokenRange
from harness.predict.prefix_cache import predict_prefix_hits

HARNESS = str(Path(sys.executable).parent / "harness")
VOCABULARY = VocabularyRange(low=0, high=500)
GROUPS = PrefixGroupRecipe(vocabulary=VOCABULARY, groups=3, prompts_per_group=2, shared_prefix_tokens=40,
                           prompt_tokens=[64] * 6, output_cap_tokens=[8] * 6, seed=4)
CONVERSATIONS = ConversationRecipe(vocabulary=VOCABULARY, conversations=4, turns=TokenRange(low=1, high=4),
                                   user_tokens=TokenRange(low=10, high=30), assistant_tokens=TokenRange(low=5, high=20),
                                   output_cap_tokens=8, seed=5)


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, timeout=120)


def test_prompts_of_a_group_share_exactly_its_prefix(tmp_path: Path) -> None:
    inventory = load_inventory(write_inventory(build_prefix_group_inventory("groups", GROUPS), tmp_path / "g"))
    ids = [p.token_ids or [] for p in inventory.prompts]
    assert [len(i) for i in ids] == [64] * 6
    assert ids[0][:40] == ids[1][:40] and ids[2][:40] == ids[3][:40]  # group-major: prompts 0-1, 2-3, 4-5
    assert ids[0][:40] != ids[2][:40] and ids[0][40:] != ids[1][40:]
    assert rebuild(inventory.manifest).digest == inventory.digest
    assert inventory.manifest.kind == "token_ids" and inventory.manifest.recipe.kind == "prefix_groups"


def test_a_salted_group_shares_nothing_and_the_prediction_says_so() -> None:
    inventory = build_prefix_group_inventory("groups", GROUPS)
    sent = [(p.prompt_id, 8) for p in inventory.prompts]
    # Block 16: each group's second prompt hits 40 // 16 = 2 blocks: 3 groups x 32 = 96 tokens.
    assert predict_prefix_hits(sent_prompts(inventory, sent), 16).hit_tokens == 96
    cold = salted(inventory, "run-1")
    ids = [p.token_ids or [] for p in cold.prompts]
    assert ids[0][SALT_TOKENS:40] == ids[1][SALT_TOKENS:40] and ids[0][:SALT_TOKENS] != ids[1][:SALT_TOKENS]
    assert predict_prefix_hits(sent_prompts(cold, sent), 16).hit_tokens == 0
    assert rebuild(cold.manifest).digest == cold.digest


def test_each_turn_holds_the_history_as_recorded_then_its_message(tmp_path: Path) -> None:
    inventory = load_inventory(write_inventory(build_conversation_inventory("talk", CONVERSATIONS), tmp_path / "c"))
    assert rebuild(inventory.manifest).digest == inventory.digest
    by_conversation: dict[str, list] = {}
    for prompt in inventory.prompts:
        by_conversation.setdefault(prompt.conversation_id or "", []).append(prompt)
    assert sorted(by_conversation) == ["c0000", "c0001", "c0002", "c0003"]
    for turns in by_conversation.values():
        assert [t.turn for t in turns] == list(range(1, len(turns) + 1)) and 1 <= len(turns) <= 4
        assert 10 <= turns[0].prompt_tokens <= 30
        for earlier, later in itertools.pairwise(turns):
            # the earlier prompt, its recorded reply (5-20) and the new message (10-30)
            assert later.token_ids[: earlier.prompt_tokens] == earlier.token_ids
            assert earlier.prompt_tokens + 15 <= later.prompt_tokens <= earlier.prompt_tokens + 50
    segments = prompt_segments(inventory)
    last = max(by_conversation.values(), key=len)[-1]
    assert sum(s.tokens for s in segments[last.prompt_id]) == last.prompt_tokens


def test_lone_prompts_keep_the_line_they_were_built_with() -> None:
    # The conversation fields are left out of a lone prompt's line, so every earlier inventory's hash holds.
    line = build_prefix_group_inventory("groups", GROUPS).prompts[0].line()
    assert "conversation_id" not in line and '"chat":false,"sha256"' in line
    turn = build_conversation_inventory("talk", CONVERSATIONS).prompts[0].line()
    assert '"conversation_id":"c0000","turn":1,"sha256"' in turn


def test_a_turn_without_its_reply_before_a_later_turn_is_refused() -> None:
    turns = [ConversationTurn(user_token_ids=[1, 2], output_cap_tokens=4),
             ConversationTurn(user_token_ids=[3], output_cap_tokens=4)]
    with pytest.raises(ValueError, match="conversation x turn 1: no recorded reply"):
        conversation_prompts([Conversation(conversation_id="x", turns=turns)])


def test_reuse_prices_one_pass_before_it_runs() -> None:
    # prompts/qwen3-4b-shared-prefix: 8 prompts of 2,048 sharing the first 1,536 = 96 blocks of 16: the first
    # misses, the other 7 hit 1,536 each = 10,752 of the 8 x 2,048 = 16,384 queried.
    priced = harness("prompts", "reuse", "prompts/qwen3-4b-shared-prefix", "--block-size", "16")
    assert priced.returncode == 0, priced.stderr
    assert "16384 prompt tokens queried, 10752 hit in blocks of 16" in priced.stdout


def test_the_build_commands_write_and_refuse_in_one_line(tmp_path: Path) -> None:
    built = harness("prompts", "build", "token-ids", str(tmp_path / "g"), "--vocab-high", "500", "--prompt-tokens",
                    "64", "--output-cap-tokens", "8", "--prefix-groups", "3", "--prompts-per-group", "2",
                    "--shared-prefix-tokens", "40", "--seed", "4", "--name", "groups")
    assert built.returncode == 0, built.stderr
    assert load_inventory(tmp_path / "g").digest == build_prefix_group_inventory("groups", GROUPS).digest
    talk = harness("prompts", "build", "conversations", str(tmp_path / "c"), "--vocab-high", "500",
                   "--conversations", "4", "--turns", "1-4", "--user-tokens", "10-30", "--assistant-tokens", "5-20",
                   "--output-cap-tokens", "8", "--seed", "5", "--name", "talk")
    assert talk.returncode == 0, talk.stderr
    assert load_inventory(tmp_path / "c").digest == build_conversation_inventory("talk", CONVERSATIONS).digest
    refusals = {
        "--prompt-tokens: 2 lengths for 3 groups × 2 prompts": ("token-ids", "--prompt-tokens", "64,70",
                                                                "--prefix-groups", "3", "--prompts-per-group", "2",
                                                                "--shared-prefix-tokens", "40"),
        "--prefix-groups and --prompts-per-group: give both": ("token-ids", "--prompt-tokens", "64",
                                                               "--prompts-per-group", "2"),
        "--turns: '4-2'": ("conversations", "--conversations", "1", "--turns", "4-2", "--user-tokens", "10",
                           "--assistant-tokens", "5"),
        "--user-tokens: 'ten'": ("conversations", "--conversations", "1", "--turns", "2", "--user-tokens", "ten",
                                 "--assistant-tokens", "5"),
    }
    for number, (message, args) in enumerate(refusals.items()):
        common = ("--vocab-high", "500", "--output-cap-tokens", "8")
        result = harness("prompts", "build", args[0], str(tmp_path / f"bad{number}"), *common, *args[1:])
        assert result.returncode != 0 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / f"bad{number}" / "manifest.json").exists()
