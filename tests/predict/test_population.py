"""The live population of a workload's requests, and the first load at which a limit binds."""

import pytest

from harness.errors import HarnessError
from harness.predict.population import Bound, live_population, predict_knee, request_blocks


def test_each_request_holds_whole_blocks_of_its_prompt_and_output() -> None:
    # 1,000 tokens in blocks of 16: 62.5 → 63 blocks; 16 tokens: exactly 1; 17: 2
    assert request_blocks([1000, 16, 17], 16).tolist() == [63, 1, 2]


def test_fixed_lengths_preempt_where_one_more_request_at_its_largest_overflows_and_queue_later() -> None:
    # 500 + 500 tokens in blocks of 16: 63 blocks at their largest, against 200 usable: 3 requests hold 189
    # (fit), 4 hold 252 (preemption). Part-way through its output a request holds 47.4 blocks on average
    # (ceil((501 … 1,000) / 16)), and an arrival's prompt 32: 3 others + 32 ≈ 174 fit, 4 others + 32 ≈ 222
    # do not, so arrivals wait from 5
    knee = predict_knee([500] * 4, [500] * 4, block_size=16, usable_blocks=200, max_num_seqs=8,
                        largest_concurrency=16)
    assert (knee.knee_concurrency, knee.bound_by, knee.queue_knee_concurrency) == (5, Bound.KV_CACHE, 5)
    assert knee.always_fits_up_to_concurrency == 3 and knee.preemption_knee_concurrency == 4


def test_the_sequence_cap_binds_first_when_the_cache_holds_more_than_it_lets_run() -> None:
    # max_num_seqs 2: at most 2 × 63 = 126 blocks live, under 200, so the cache never preempts;
    # the third request waits in the queue, so the cap binds at 3, before the cache would (5, above)
    knee = predict_knee([500] * 4, [500] * 4, block_size=16, usable_blocks=200, max_num_seqs=2,
                        largest_concurrency=16)
    assert (knee.knee_concurrency, knee.bound_by, knee.preemption_knee_concurrency) == (3, Bound.MAX_NUM_SEQS, None)


def test_no_limit_binds_within_the_range_asked_about() -> None:
    # 4 × 63 = 252 blocks fit 1,000 usable, and the cap of 8 is past the range
    knee = predict_knee([500] * 4, [500] * 4, block_size=16, usable_blocks=1000, max_num_seqs=8,
                        largest_concurrency=4)
    assert (knee.knee_concurrency, knee.bound_by) == (None, Bound.NONE)


def test_a_long_tail_decides_the_population_not_its_mean() -> None:
    # two requests of 1 block and one of 100; two in flight drawn without replacement:
    # {1, 1} = 2 blocks with probability 1/3, {1, 100} = 101 with probability 2/3
    draws = live_population([16, 16, 1600], 2, block_size=16, usable_blocks=50, draws=3000, seed=1)
    assert draws.p50_blocks == 101 and draws.max_blocks == 101
    assert draws.fit_share == pytest.approx(1 / 3, abs=0.03)  # 3,000 draws: standard error ~0.009


def test_a_population_larger_than_the_inventory_repeats_its_prompts() -> None:
    # 5 in flight from 2 prompts of 1 and 3 blocks: the inventory repeated 3 times is [1, 3] × 3;
    # the largest draw takes the three 3s and two 1s = 11 blocks
    draws = live_population([16, 48], 5, block_size=16, usable_blocks=100, draws=200)
    assert draws.max_blocks == 11 and draws.fit_share == 1.0


def test_the_sequence_cap_limits_the_live_population() -> None:
    # 8 requested, 2 may run: the live population is 2 × 63 = 126 blocks whatever the draw
    draws = live_population([1000] * 4, 8, block_size=16, usable_blocks=200, max_num_seqs=2, draws=50)
    assert (draws.live_requests, draws.p50_blocks, draws.max_blocks) == (2, 126, 126)


@pytest.mark.parametrize("tokens, block_size", [([], 16), ([0], 16), ([10], 0)])
def test_an_empty_or_nonpositive_workload_is_refused(tokens: list[int], block_size: int) -> None:
    with pytest.raises(HarnessError):
        request_blocks(tokens, block_size)


def test_conversations_go_in_flight_one_turn_each() -> None:
    # Blocks of 128: conversation a's one turn holds 1 block; b's 1 and 3; c's 1, 3 and 5. At 2 in flight the
    # pair of distinct conversations sums to 2, 4, 6 or 8 blocks with P(<= 2) = 0.261 and P(<= 4) = 0.619
    # (worked out in tests/predict/test_budget_inventory.py), so its median, 4, fits 4 usable blocks. At 3 all
    # three are in flight, 1 + {1, 3} + {1, 3, 5}: 3, 5, 5, 7, 7, 9, each 1/6, and the median, 5 or 7, does
    # not fit: the cache binds at 3. At 1 the largest turn alone, 5 blocks, is over 4, so none always fits.
    tokens, ids = [128, 128, 328, 128, 328, 528], ["a", "b", "b", "c", "c", "c"]
    knee = predict_knee([token - 28 for token in tokens], [28] * 6, block_size=128, usable_blocks=4,
                        max_num_seqs=None, largest_concurrency=6, conversation_ids=ids)
    assert (knee.preemption_knee_concurrency, knee.always_fits_up_to_concurrency) == (3, 0)
    # At most, 3 in flight are each conversation at its last turn: 1 + 3 + 5 = 9 blocks. Taken as 6 independent
    # requests, the largest 3 would be c's turns 3 and 2 with b's turn 2, 5 + 3 + 3 = 11, which the client never
    # sends together.
    three = live_population(tokens, 3, block_size=128, usable_blocks=4, conversation_ids=ids)
    assert three.conversations == 3 and three.max_blocks == 9 and three.p50_blocks in (5, 7)
    independent = live_population(tokens, 3, block_size=128, usable_blocks=4)
    assert independent.conversations is None and independent.max_blocks == 11
