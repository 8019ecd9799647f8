"""`harness budget --inventory DIR --concurrency C`: the live population of C requests drawn from an
inventory, against the KV blocks vLLM logged or the calculator predicts; expected figures worked out below."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.inventory.frozen import VocabularyRange, write_inventory
from harness.inventory.lengths import ImportedLengths
from harness.inventory.prefix_groups import build_conversation_lengths_inventory
from harness.inventory.workload_recipes import ConversationLengthsRecipe, TurnLengths

HARNESS = str(Path(sys.executable).parent / "harness")
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "160"}


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HARNESS, *args], capture_output=True, text=True, env=OFFLINE, timeout=120)


@pytest.fixture(scope="module")
def four_requests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prompts of 100, 200, 300 and 400 tokens, each with a 28-token output cap: requests of 128, 228, 328
    and 428 tokens."""
    out = tmp_path_factory.mktemp("inventories") / "four"
    built = harness("prompts", "build", "token-ids", str(out), "--vocab-high", "100",
                    "--prompt-tokens", "100,200,300,400", "--output-cap-tokens", "28")
    assert built.returncode == 0, built.stderr
    return out


def priced(*args: str) -> dict:
    result = harness("budget", *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_two_of_four_requests_against_logged_blocks(four_requests: Path) -> None:
    # Blocks of 128 tokens: the requests hold ceil(128/128) = 1, 2, 3 and 4 blocks. Two in flight are two
    # distinct prompts (the client cycles through the inventory): the 6 pairs sum to 3, 4, 5, 5, 6, 7 blocks,
    # each pair 1/6 likely. CDF: 3 → 1/6, 4 → 2/6, 5 → 4/6, 6 → 5/6, 7 → 1, so p50 = 5 blocks (640 tokens),
    # p99 = max = 7 blocks (4 + 3; 896 tokens). --num-gpu-blocks 6 leaves 5 for requests (block 0 is vLLM's null
    # block): the pairs summing to at most 5 are 4 of 6, a fit share of 0.667; over 4,096 draws its standard
    # error is sqrt(0.667 × 0.333 / 4096) = 0.0074, so it lies within ±0.03.
    data = priced("--inventory", str(four_requests), "--concurrency", "2", "--block-size", "128",
                  "--num-gpu-blocks", "6")
    population = data["population"]
    assert (data["inventory"], data["prompt_count"]) == ("four", 4)
    assert data["kv"]["usable_blocks"] == 5 == population["usable_blocks"]
    assert (population["p50_blocks"], population["p99_blocks"], population["max_blocks"]) == (5, 7, 7)
    assert (population["p50_live_tokens"], population["p99_live_tokens"], population["max_live_tokens"]) == \
        (640, 896, 896)
    assert abs(population["fit_share"] - 4 / 6) < 0.03


def test_more_in_flight_than_max_num_seqs_and_the_logged_token_count(four_requests: Path) -> None:
    # 8 in flight but max_num_seqs 2: only 2 hold blocks, so the figures are the pair's above. --kv-cache-tokens
    # 768 is 768 / 128 = 6 blocks, 5 for requests: the same fit.
    data = priced("--inventory", str(four_requests), "--concurrency", "8", "--max-num-seqs", "2",
                  "--block-size", "128", "--kv-cache-tokens", "768")
    population = data["population"]
    assert (population["concurrency"], population["live_requests"]) == (8, 2)
    assert (population["p50_blocks"], population["max_blocks"]) == (5, 7)
    assert data["kv"]["usable_blocks"] == 5


def test_blocks_computed_by_the_calculator_for_the_pinned_model(four_requests: Path) -> None:
    # Qwen3-4B holds 147,456 B of KV per token (36 layers × 8 KV heads × 128 × 2 (K and V) × 2 B); a block of 16
    # tokens is 2,359,296 B, so 1 GiB = 1,073,741,824 B holds 455 blocks (455.1), 454 for requests. Blocks of 16:
    # the requests hold ceil(128/16) = 8, ceil(228/16) = 15, ceil(328/16) = 21 and ceil(428/16) = 27 blocks;
    # four in flight from four prompts are all four, every draw: 71 blocks = 1,136 tokens, and they fit.
    data = priced("--inventory", str(four_requests), "--concurrency", "4", "--model", "Qwen/Qwen3-4B",
                  "--available-kv-gib", "1")
    population = data["population"]
    assert data["kv"]["usable_blocks"] == 454 and data["kv"]["block_size"] == 16
    assert (population["p50_blocks"], population["p99_blocks"], population["max_blocks"]) == (71, 71, 71)
    assert population["max_live_tokens"] == 1136 and population["fit_share"] == 1.0


def test_the_table_reads_the_same_figures(four_requests: Path) -> None:
    result = harness("budget", "--inventory", str(four_requests), "--concurrency", "2", "--block-size", "128",
                     "--num-gpu-blocks", "6")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "p50 block-padded live tokens │ 640 (5 blocks)" in out
    assert "max block-padded live tokens │ 896 (7 blocks)" in out
    assert "share of draws that fit │ 0.6" in out


@pytest.fixture(scope="module")
def three_conversations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conversations of 1, 2 and 3 turns whose turn k has a prompt of 100, 300, 500 tokens (its history
    included) and a 28-token cap: requests of 128, 328 and 528 tokens."""
    turns = [TurnLengths(prompt_tokens=100 + 200 * k, output_cap_tokens=28) for k in range(3)]
    recipe = ConversationLengthsRecipe(
        vocabulary=VocabularyRange(low=0, high=100), conversations=[turns[:1], turns[:2], turns], seed=0,
        lengths=ImportedLengths(format="sharegpt", source="three.json", source_sha256="0" * 64, records=3,
                                skipped_records=0, tokenizer=None))
    out = tmp_path_factory.mktemp("inventories") / "three"
    write_inventory(build_conversation_lengths_inventory("three", recipe), out)
    return out


def test_conversations_in_flight_each_at_one_turn(three_conversations: Path) -> None:
    # Blocks of 128: A's turn holds 1 block; B's turns 1 and ceil(328/128) = 3; C's 1, 3 and ceil(528/128) = 5.
    # Two in flight are two distinct conversations, every one of the 6 turns equally likely: the first drawn is A,
    # B or C with 1/6, 2/6, 3/6; the second from the other two's turns. So the pair is {A,B} with 1/6·2/5 + 2/6·1/4
    # = 9/60, {A,C} 1/6·3/5 + 3/6·1/3 = 16/60, {B,C} 2/6·3/4 + 3/6·2/3 = 35/60, each at a uniform turn of its own:
    #   {A,B}: 1 + {1,3} = 2, 4;  {A,C}: 1 + {1,3,5} = 2, 4, 6;  {B,C}: {1,3} + {1,3,5} = 2, 4, 4, 6, 6, 8.
    # P(2) = 9/60·1/2 + 16/60·1/3 + 35/60·1/6 = 15.67/60, P(4) = 9/60·1/2 + 16/60·1/3 + 35/60·2/6 = 21.5/60,
    # P(6) = 16/60·1/3 + 35/60·2/6 = 17/60, P(8) = 35/60·1/6 = 5.83/60. CDF: 2 → 0.261, 4 → 0.619, 6 → 0.903, 8 → 1:
    # p50 = 4 blocks (512 tokens), p99 = max = 8 (C's last turn and B's: 5 + 3; 1,024 tokens). 5 usable blocks
    # hold the draws of 2 and 4: a fit share of 37.17/60 = 0.619 (standard error over 4,096 draws 0.0076: ±0.03).
    # Drawn as 6 independent requests instead, C's turns 2 and 3 (3 + 5 = 8) could be in flight together, which
    # the client never does.
    data = priced("--inventory", str(three_conversations), "--concurrency", "2", "--block-size", "128",
                  "--num-gpu-blocks", "6")
    population = data["population"]
    assert (data["prompt_count"], population["conversations"]) == (6, 3)
    assert (population["p50_blocks"], population["p99_blocks"], population["max_blocks"]) == (4, 8, 8)
    assert population["max_live_tokens"] == 1024
    assert abs(population["fit_share"] - 37.17 / 60) < 0.03


def test_more_conversations_in_flight_than_the_inventory_holds(three_conversations: Path) -> None:
    # 4 in flight from 3 conversations: the passes overlap, so one conversation is in flight twice. The largest
    # four of the conversations repeated (A, B, C, A, B, C) at their last turns: 5 + 5 + 3 + 3 = 16 blocks.
    data = priced("--inventory", str(three_conversations), "--concurrency", "4", "--block-size", "128",
                  "--num-gpu-blocks", "6")
    assert data["population"]["max_blocks"] == 16 and data["population"]["live_requests"] == 4
    table = harness("budget", "--inventory", str(three_conversations), "--concurrency", "2", "--block-size", "128",
                    "--num-gpu-blocks", "6")
    assert "2 conversations from three (3 conversations of 6 turns" in " ".join(table.stdout.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--concurrency", "2"], "--inventory needs the engine's KV blocks"),
    (["--num-gpu-blocks", "6"], "--inventory needs --concurrency"),
    (["--concurrency", "0", "--num-gpu-blocks", "6"], "--concurrency: Input should be greater than or equal to 1"),
    (["--concurrency", "2", "--num-gpu-blocks", "6", "--kv-cache-tokens", "99"], "give only one of"),
    (["--concurrency", "2", "--kv-cache-tokens", "100", "--block-size", "128"], "leave none for requests"),
])
def test_bad_input_is_one_line(four_requests: Path, args: list[str], message: str) -> None:
    result = harness("budget", "--inventory", str(four_requests), *args)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
