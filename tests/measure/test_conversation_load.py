"""How a conversation inventory is sent: its turns grouped into one job per conversation and pass, a closed
loop over the inventory in order, and reuse figures per turn from the records."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.inventory.fields import ChatMessage
from harness.inventory.frozen import VocabularyRange, make_prompt, write_inventory
from harness.inventory.prefix_groups import build_conversation_inventory, build_prefix_group_inventory
from harness.inventory.workload_recipes import ConversationRecipe, PrefixGroupRecipe, TokenRange
from harness.measure.client import RequestRecord
from harness.measure.dispatch import _request, check_conversation_load, conversation_jobs
from harness.measure.record import ServerSample
from harness.measure.reuse_figures import reuse_figures, turn_figures
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.schedule import LoadShape, Slot, plan
from harness.observe.server_metrics import MetricsSnapshot

VOCABULARY = VocabularyRange(low=0, high=500)
# 2 conversations of 3 turns each: prompts c0000t01-03, then c0001t01-03.
TALK = build_conversation_inventory("talk", ConversationRecipe(
    vocabulary=VOCABULARY, conversations=2, turns=TokenRange(low=3, high=3), user_tokens=TokenRange(low=10, high=10),
    assistant_tokens=TokenRange(low=5, high=5), output_cap_tokens=4, seed=1))
GROUPS = build_prefix_group_inventory("groups", PrefixGroupRecipe(
    vocabulary=VOCABULARY, groups=1, prompts_per_group=2, shared_prefix_tokens=8, prompt_tokens=[16, 16],
    output_cap_tokens=[4, 4], seed=1))


def jobs(shape: LoadShape) -> list[list[int]]:
    slots = plan(shape, len(TALK.prompts))
    found = conversation_jobs(slots, lambda slot: TALK.prompts[slot.prompt_index].conversation_id)
    return [[slot.prompt_index for slot in job] for job in found]


def test_a_conversations_turns_are_one_job_and_a_new_pass_starts_a_new_one() -> None:
    assert jobs(LoadShape(concurrency=2)) == [[0, 1, 2], [3, 4, 5]]
    # 8 requests: one pass (6), then the second pass's first conversation cut after 2 turns.
    assert jobs(LoadShape(concurrency=2, requests=8)) == [[0, 1, 2], [3, 4, 5], [0, 1]]


def test_lone_prompts_are_jobs_of_one() -> None:
    slots = plan(LoadShape(concurrency=2), len(GROUPS.prompts))
    found = conversation_jobs(slots, lambda slot: GROUPS.prompts[slot.prompt_index].conversation_id)
    assert [[slot.prompt_index for slot in job] for job in found] == [[0], [1]]


@pytest.mark.parametrize(("shape", "message"), [
    (LoadShape(rate_per_s=2.0), "holds conversations: give --concurrency"),
    (LoadShape(concurrency=2, order="shuffled"), "--order shuffled"),
])
def test_conversations_need_a_closed_loop_in_inventory_order(shape: LoadShape, message: str) -> None:
    with pytest.raises(HarnessError, match=message):
        check_conversation_load(shape, TALK)


def test_think_time_without_conversations_is_refused() -> None:
    check_conversation_load(LoadShape(concurrency=2, think_time_s=1.0), TALK)
    with pytest.raises(HarnessError, match="--think-time-s 1: inventory groups holds no conversations"):
        check_conversation_load(LoadShape(concurrency=2, think_time_s=1.0), GROUPS)


def record(index: int, turn: int, ttft_s: float, cached: int | None) -> RequestRecord:
    return RequestRecord(index=index, prompt_id=f"p{index}", warmup=False, max_tokens=4, scheduled_s=0.0,
                         dispatch_s=0.0, first_token_s=ttft_s, end_s=1.0, prompt_tokens=100 * turn,
                         conversation_id=f"c{index}", turn=turn, cached_prompt_tokens=cached)


def test_turn_figures_group_the_measured_turns_by_their_number() -> None:
    records = [record(0, 1, 0.1, 0), record(1, 1, 0.3, 0), record(2, 2, 0.2, 64), record(3, 2, 0.4, None)]
    figures = turn_figures(records, {0: 0, 1: 0, 2: 64, 3: 128})
    assert [f.turn for f in figures] == [1, 2] and [f.requests_ok for f in figures] == [2, 2]
    # turn 1: TTFTs 100 and 300 ms, mean 200; turn 2: 200 and 400 ms, mean 300
    assert figures[0].ttft_ms_mean == pytest.approx(200.0) and figures[1].ttft_ms_mean == pytest.approx(300.0)
    # predicted hits by index: turn 2 (64 + 128) / 2 = 96; reported only by record 2: 64
    assert figures[1].hit_tokens_predicted_mean == 96 and figures[1].cached_prompt_tokens_mean == 64
    assert figures[1].prompt_tokens_mean == 200


def snapshot_sample(t_s: float, queries: int, hits: int, caching: str = "True") -> ServerSample:
    config = {"block_size": "16", "num_gpu_blocks": "101", "enable_prefix_caching": caching}
    return ServerSample(t_s=t_s, snapshot=MetricsSnapshot(prefix_cache_queries_total=queries,
                                                          prefix_cache_hits_total=hits, cache_config=config))


def sent_record(index: int, prompt_id: str) -> RequestRecord:
    return RequestRecord(index=index, prompt_id=prompt_id, warmup=False, max_tokens=4, scheduled_s=0.0,
                         dispatch_s=float(index), first_token_s=index + 0.1, end_s=index + 0.5, prompt_tokens=16,
                         output_tokens=4)


def test_reuse_figures_set_the_counters_growth_beside_the_prediction() -> None:
    # GROUPS: 2 prompts of 16 sharing 8; block 16: the shared 8 tokens fill no whole block, so 0 hits predicted.
    # The counters grew by 32 queried (2 x 16) and 0 hit tokens.
    records = [sent_record(0, "p0000"), sent_record(1, "p0001")]
    figures, turns = reuse_figures(GROUPS, records, [snapshot_sample(0.0, 100, 10), snapshot_sample(2.0, 132, 10)])
    assert (figures.block_size_tokens, figures.cache_blocks) == (16, 100)
    assert figures.queried_tokens_measured == figures.queried_tokens_predicted == 32
    assert figures.hit_tokens_measured == figures.hit_tokens_predicted == 0 and figures.hits_as_predicted is True
    assert turns == []
    # With caching off vLLM looks nothing up: nothing predicted, whatever the prompts share.
    off, _ = reuse_figures(GROUPS, records, [snapshot_sample(0.0, 0, 0, "False"), snapshot_sample(2.0, 0, 0, "False")])
    assert off.queried_tokens_predicted == 0 and off.hit_tokens_predicted == 0 and off.hits_as_predicted is True


def test_a_turn_and_a_recorded_chat_reach_the_client_each_with_its_own_fields(tmp_path: Path) -> None:
    """A conversation's turn goes out as token ids with its conversation and turn; a prompt of recorded chat
    messages (an import) goes out with its messages, and no conversation."""
    write_inventory(TALK, tmp_path / "talk")
    config, _ = build_run_config(RunOptions(inventory=tmp_path / "talk", base_url="http://127.0.0.1:9",
                                            load=LoadShape(concurrency=1, requests=1)))
    slot = Slot(index=0, prompt_index=1, send_at_s=None, warmup=False)
    turn = _request(slot, TALK.prompts[1], config)  # c0000t02: the second turn of the first conversation
    assert (turn.conversation_id, turn.turn, turn.messages) == ("c0000", 2, None)
    assert turn.token_ids == TALK.prompts[1].token_ids and not turn.chat
    recorded = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi")]
    chat = _request(slot, make_prompt("p0", 7, 4, messages=recorded), config)
    assert chat.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat.chat and (chat.conversation_id, chat.turn) == (None, None)
