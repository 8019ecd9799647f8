"""The population an arriving request finds, and the first load at which arrivals wait for blocks."""

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.predict.queueing import arrival_blocks, queue_knee

# The demo's engine and inventory: 31 usable blocks of 128; prompts of 600 tokens, outputs of 300.
PROMPTS, OUTPUTS = [600] * 8, [300] * 8


def test_an_arrival_alone_needs_its_prompts_blocks() -> None:
    # 600 tokens in blocks of 128: ceil(4.69) = 5, whatever the draw
    assert set(arrival_blocks(PROMPTS, OUTPUTS, 1, block_size=128).tolist()) == {5}


def test_a_request_in_flight_holds_the_blocks_of_what_it_has_generated_so_far() -> None:
    # generated 0 … 299 tokens, uniformly, plus the next token's slot: 601 … 900 tokens, in blocks of 128
    # 5 blocks for 601-640 (40 of 300), 6 for 641-768 (128), 7 for 769-896 (128), 8 for 897-900 (4):
    # (5·40 + 6·128 + 7·128 + 8·4) / 300 = 6.32 blocks, and the arrival's 5 on top: 11.32 for 2 in flight
    needed = arrival_blocks(PROMPTS, OUTPUTS, 2, block_size=128, draws=20000)
    assert set(needed.tolist()) == {10, 11, 12, 13}
    assert needed.mean() == pytest.approx(11.32, abs=0.03)  # 20,000 draws: standard error ~0.005


def test_on_the_demos_engine_arrivals_wait_from_six_in_flight() -> None:
    # 4 others × 6.32 + 5 = 30.3 blocks fit 31; 5 others × 6.32 + 5 = 36.6 do not
    assert np.median(arrival_blocks(PROMPTS, OUTPUTS, 5, block_size=128)) <= 31
    assert np.median(arrival_blocks(PROMPTS, OUTPUTS, 6, block_size=128)) > 31
    assert queue_knee(PROMPTS, OUTPUTS, block_size=128, usable_blocks=31, largest_concurrency=8) == 6
    assert queue_knee(PROMPTS, OUTPUTS, block_size=128, usable_blocks=31, largest_concurrency=5) is None


def test_a_long_request_is_in_flight_for_longer_and_so_is_found_more_often() -> None:
    # one request of output 1 and one of output 99 (prompts of 1 block each): the one found in flight is
    # the long one 99 times in 100, holding 17 … 115 tokens (16 + 0 … 98 generated + 1): 2 to 7 blocks of
    # 16 for 16 draws each and 8 for 3, (16 · 27 + 8 · 3) / 99 = 4.61 on average; the short one holds 2
    # (16 + 0 + 1 = 17 tokens). Drawn evenly they would average 3.3.
    needed = arrival_blocks([16, 16], [1, 99], 2, block_size=16, draws=20000) - 1  # less the arrival's block
    assert needed.mean() == pytest.approx(0.99 * 456 / 99 + 0.01 * 2, abs=0.05)


@pytest.mark.parametrize("prompts, outputs", [([], []), ([10], [0]), ([0], [10]), ([10, 10], [10])])
def test_a_workload_without_positive_lengths_is_refused(prompts: list[int], outputs: list[int]) -> None:
    with pytest.raises(HarnessError):
        arrival_blocks(prompts, outputs, 2, block_size=16)
