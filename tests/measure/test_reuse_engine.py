"""Prefix-cache reuse on the real CPU engine: predicted hit tokens against vLLM's counters, a salted cold run,
and conversations sent turn by turn: synthetic ones of token ids, and recorded ones imported from ShareGPT; and
imported chat requests sharing a system prompt.

One engine start (prefix caching on, the project's default) serves every run: 4 MiB of KV cache is 32 blocks
of 128 tokens, one the null block, so 31 usable; max_model_len 1,024. Each run sends a fresh inventory, so no
run can hit what an earlier one cached. `--enable-prompt-tokens-details` makes every response report its own
cached tokens, the per-request reuse beside the counters' totals.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest

from harness.dev.tiny_model import SPECIAL_TOKENS, VOCAB_SIZE
from harness.inventory.frozen import Inventory, InventoryPrompt, VocabularyRange, write_inventory
from harness.inventory.importing import import_text, source_of
from harness.inventory.prefix_groups import build_conversation_inventory, build_prefix_group_inventory
from harness.inventory.recipe import ImportRecipe
from harness.inventory.workload_recipes import ConversationRecipe, PrefixGroupRecipe, TokenRange
from harness.measure.client import RequestRecord
from harness.measure.record import read_requests
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape
from harness.measure.stats import RunSummary

from conftest import local_cpu_engine

pytestmark = pytest.mark.engine

BLOCK = 128
VOCABULARY = VocabularyRange(low=0, high=VOCAB_SIZE - len(SPECIAL_TOKENS))
# 2 groups x 4 prompts of 500 tokens, the first 300 shared in each group, 16 output tokens.
GROUPS = PrefixGroupRecipe(vocabulary=VOCABULARY, groups=2, prompts_per_group=4, shared_prefix_tokens=300,
                           prompt_tokens=[500] * 8, output_cap_tokens=[16] * 8, seed=11)
# 3 conversations of 2-3 turns: user messages of 140-200 tokens, recorded replies of 100-140; the longest
# turn is at most 3 x 200 + 2 x 140 = 880 prompt + 16 output tokens, within max_model_len.
CONVERSATIONS = ConversationRecipe(vocabulary=VOCABULARY, conversations=3, turns=TokenRange(low=2, high=3),
                                   user_tokens=TokenRange(low=140, high=200),
                                   assistant_tokens=TokenRange(low=100, high=140), output_cap_tokens=16, seed=12)
# 4 chat requests sharing a system prompt, and one without (tests/inventory/test_import_prefixes.py works out
# what they share).
SHARED_SYSTEM = Path(__file__).resolve().parents[1] / "fixtures" / "traffic" / "shared-system.jsonl"


def _imported(tokenizer: Path) -> Inventory:
    sha, _, _ = source_of(SHARED_SYSTEM, "openai", None, 0, conversations=False)
    recipe = ImportRecipe(format="openai", source=str(SHARED_SYSTEM), source_sha256=sha, tokenizer=str(tokenizer),
                          seed=0)
    return import_text("imported", recipe).inventory


CORPUS = Path(__file__).resolve().parents[2] / "harness" / "corpus" / "serving.txt"


def _recorded_conversations(tiny_model_dir: Path, work: Path) -> Inventory:
    """Two ShareGPT conversations of three exchanges cut from the bundled corpus: questions of 110 words
    (about 140 tiny-model tokens), answers of 40, so turn 2 repeats more than one block of turn 1 and the
    longest turn, about 3 x 140 + 2 x 50 tokens and the template's, fits max_model_len."""
    words = CORPUS.read_text().split()
    pieces = iter(" ".join(words[start:start + size]) for start, size in
                  zip(itertools.accumulate([0] + [110, 40] * 6), [110, 40] * 6, strict=False))
    records = [{"id": f"r{n}", "conversations": [{"from": side, "value": next(pieces)}
                                                 for _ in range(3) for side in ("human", "gpt")]} for n in range(2)]
    source = work / "recorded.json"
    source.write_text(json.dumps(records, indent=1))
    recipe = ImportRecipe(format="sharegpt", source=str(source), source_sha256=hashlib.sha256(source.read_bytes())
                          .hexdigest(), tokenizer=str(tiny_model_dir), seed=0, conversations=True)
    return import_text("recorded", recipe).inventory


def _run(engine_url: str, inventory: Inventory, work: Path, load: LoadShape, **options: object) -> RunSummary:
    directory = write_inventory(inventory, work / f"{inventory.manifest.name}-inventory")
    config, loaded = build_run_config(RunOptions(inventory=directory, base_url=engine_url, load=load,
                                                 sample_interval_s=0.5, **options))
    return run_load(config, loaded, work / inventory.manifest.name, ready_timeout_s=60)


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[RunSummary, Path]]:
    work = tmp_path_factory.mktemp("reuse-engine")
    salted = GROUPS.model_copy(update={"salt": "cold-run"})
    with local_cpu_engine(tiny_model_dir, work / "engine.log", max_num_seqs=8, kv_cache_memory_bytes=4_194_304,
                          max_model_len=1024, block_size=BLOCK, extra_args="--enable-prompt-tokens-details") as engine:
        return {
            "groups": (_run(engine.base_url, build_prefix_group_inventory("groups", GROUPS), work,
                            LoadShape(concurrency=8)), work / "groups"),
            "salted": (_run(engine.base_url, build_prefix_group_inventory("salted", salted), work,
                            LoadShape(concurrency=8), cold=True), work / "salted"),
            "conversations": (_run(engine.base_url, build_conversation_inventory("conversations", CONVERSATIONS),
                                   work, LoadShape(concurrency=2, think_time_s=0.05)), work / "conversations"),
            "recorded": (_run(engine.base_url, _recorded_conversations(tiny_model_dir, work), work,
                              LoadShape(concurrency=2)), work / "recorded"),
            "imported": (_run(engine.base_url, _imported(tiny_model_dir), work, LoadShape(concurrency=5)),
                         work / "imported"),
        }


def test_predicted_prefix_hits_equal_the_engine_counters(runs: dict[str, tuple[RunSummary, Path]]) -> None:
    summary, run_dir = runs["groups"]
    figures = summary.prefix_cache
    assert figures is not None and figures.block_size_tokens == BLOCK and figures.cache_blocks == 31
    # All 8 arrive at once. In each group the first request admitted misses; the other 3 reuse the shared
    # prefix's whole blocks, floor(300 / 128) = 2 blocks = 256 tokens, though the first's prefill may not have
    # run yet (vLLM enters blocks in its cache when it allocates them): 2 groups x 3 x 256 = 1,536 tokens.
    assert figures.hit_tokens_predicted == 1536
    assert figures.hit_tokens_measured == 1536 and figures.hits_as_predicted is True
    # Every prompt is queried whole: 8 x 500.
    assert figures.queried_tokens_measured == figures.queried_tokens_predicted == 4000
    # 8 x ceil(516 / 128) = 40 blocks, 12 of them shared: 28 of 31, so nothing was evicted.
    assert figures.eviction_possible is False
    records = read_requests(run_dir)
    assert sorted(r.cached_prompt_tokens or 0 for r in records) == [0, 0] + [256] * 6
    assert all(r.cached_prompt_tokens is not None for r in records)
    assert summary.errors_by_class == {} and summary.requests_ok == 8
    # The population the run predicted for its load, from the engine's geometry: all 8 live (no max_num_seqs
    # given to the run), 5 blocks each = 40 blocks = 5,120 tokens in every draw, none within the 31 usable.
    population = summary.population
    assert population is not None and (population.usable_blocks, population.block_size_tokens) == (31, BLOCK)
    assert population.padded_tokens_p50_predicted == population.padded_tokens_max_predicted == 5120
    assert population.fit_share_predicted == 0.0


def test_predicted_hits_of_imported_traffic_equal_the_engine_counters(
        runs: dict[str, tuple[RunSummary, Path]]) -> None:
    summary, run_dir = runs["imported"]
    figures = summary.prefix_cache
    assert figures is not None and figures.block_size_tokens == BLOCK
    # The 4 sharing the system prompt agree on its rendered turn and the user turn's header, 225 tokens:
    # 225 // 128 = 1 whole block. The first admitted misses, the other 3 hit 128 each; the fifth shares only
    # the <|im_start|> token. 3 x 128 = 384.
    assert figures.hit_tokens_predicted == 384
    assert figures.hit_tokens_measured == 384 and figures.hits_as_predicted is True
    # The prompts as the server counts them, templates included: 242 + 245 + 245 + 240 + 14 = 986.
    assert figures.queried_tokens_measured == figures.queried_tokens_predicted == 986
    assert sorted(r.cached_prompt_tokens or 0 for r in read_requests(run_dir)) == [0, 0, 128, 128, 128]
    assert summary.errors_by_class == {} and summary.requests_ok == 5


def test_a_salted_cold_run_hits_nothing(runs: dict[str, tuple[RunSummary, Path]]) -> None:
    summary, _ = runs["salted"]
    figures = summary.prefix_cache
    assert figures is not None
    # The salt rewrites each prompt's first 8 tokens, so no prompt's first block is another's: no chain of
    # block hashes is shared, and nothing makes the run declared cold invalid for a hit. (Its validity on the
    # client's side is the shared machine's: a busy core can make it send late.)
    assert figures.hit_tokens_predicted == 0 and figures.hit_tokens_measured == 0
    assert figures.queried_tokens_measured == 4000
    assert summary.server.prefix_cache_hits_during_run_tokens == 0
    assert not [reason for reason in summary.invalid_reasons if "prefix cache" in reason]
    # Unshared, the 8 need 8 x ceil(516 / 128) = 40 blocks, over the 31: the prediction is flagged an upper bound.
    assert figures.eviction_possible is True


def _by_conversation(records: list[RequestRecord]) -> dict[str, list[RequestRecord]]:
    grouped: dict[str, list[RequestRecord]] = {}
    for record in sorted(records, key=lambda r: r.dispatch_s):
        assert record.conversation_id is not None
        grouped.setdefault(record.conversation_id, []).append(record)
    return grouped


def test_a_multi_turn_run_records_every_turn_in_order_with_its_reuse(runs: dict[str, tuple[RunSummary, Path]]) -> None:
    summary, run_dir = runs["conversations"]
    inventory = build_conversation_inventory("conversations", CONVERSATIONS)
    turns_by_conversation: dict[str | None, list[InventoryPrompt]] = {}
    for prompt in inventory.prompts:
        turns_by_conversation.setdefault(prompt.conversation_id, []).append(prompt)
    records = read_requests(run_dir)
    grouped = _by_conversation(records)
    assert len(records) == len(inventory.prompts) and set(grouped) == set(turns_by_conversation)
    for conversation, sent in grouped.items():
        prompts = turns_by_conversation[conversation]
        assert [r.turn for r in sent] == list(range(1, len(prompts) + 1))
        for earlier, later in itertools.pairwise(sent):
            # sent after the turn before ended and the think time passed; uvloop's timers count whole
            # milliseconds, so a 50 ms sleep may end up to 1 ms early
            assert later.dispatch_s >= earlier.end_s + 0.05 - 0.002
        # Turn k reuses turn k-1's whole prompt in whole blocks: its reply as recorded is not what the model
        # generated, so the block holding the end of turn k-1's prompt is not shared.
        expected = [0] + [p.prompt_tokens // BLOCK * BLOCK for p in prompts[:-1]]
        assert [r.cached_prompt_tokens for r in sent] == expected
        assert [r.prompt_tokens for r in sent] == [p.prompt_tokens for p in prompts]
    figures = summary.prefix_cache
    assert figures is not None and figures.hits_as_predicted is True and figures.eviction_possible is False
    assert figures.hit_tokens_measured == figures.hit_tokens_reported == sum(r.cached_prompt_tokens or 0
                                                                             for r in records)
    assert [t.turn for t in summary.turns] == list(range(1, max(len(p) for p in turns_by_conversation.values()) + 1))
    assert summary.turns[0].hit_tokens_predicted_mean == 0 and summary.turns[0].cached_prompt_tokens_mean == 0
    assert all(t.ttft_ms_p50 is not None and t.ttft_ms_p50 > 0 for t in summary.turns)
    assert summary.errors_by_class == {}


def test_recorded_conversations_are_sent_turn_by_turn_as_the_server_counts_them(
        runs: dict[str, tuple[RunSummary, Path]], tiny_model_dir: Path, tmp_path: Path) -> None:
    summary, run_dir = runs["recorded"]
    inventory = _recorded_conversations(tiny_model_dir, tmp_path)
    prompts = {prompt.prompt_id: prompt for prompt in inventory.prompts}
    records = read_requests(run_dir)
    grouped = _by_conversation(records)
    assert len(records) == 6 and sorted(grouped) == ["c0000", "c0001"]
    for sent in grouped.values():
        assert [r.turn for r in sent] == [1, 2, 3]
        assert all(later.dispatch_s >= earlier.end_s for earlier, later in itertools.pairwise(sent))
        turns = [prompts[r.prompt_id] for r in sent]
        assert [len(p.chat_messages()) for p in turns] == [1, 3, 5]  # each turn's recorded history, then its question
        # the chat template as the inventory counted it is the server's count of every turn
        assert [r.prompt_tokens for r in sent] == [p.prompt_tokens for p in turns]
        # Turn k reuses turn k-1's prompt in whole blocks of 128: the server rendered turn k to begin with turn
        # k-1's rendering, as the prediction takes it; the block holding turn k-1's end held its generated reply.
        expected = [0] + [p.prompt_tokens // BLOCK * BLOCK for p in turns[:-1]]
        assert expected[1] >= BLOCK and [r.cached_prompt_tokens for r in sent] == expected
    figures = summary.prefix_cache
    assert figures is not None and figures.hit_tokens_predicted == figures.hit_tokens_measured
    assert figures.hits_as_predicted is True and figures.hit_tokens_measured == sum(
        r.cached_prompt_tokens or 0 for r in records)
    assert [t.turn for t in summary.turns] == [1, 2, 3] and summary.errors_by_class == {}
