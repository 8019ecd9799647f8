"""The load schedule: counts, order over passes, warm-up, and the statistics of seeded arrivals."""

from __future__ import annotations

import itertools
import statistics

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from harness.cli import app
from harness.measure.schedule import LoadShape, plan


def gaps(shape: LoadShape, prompt_count: int = 10) -> list[float]:
    slots = list(plan(shape, prompt_count))
    times = [slot.send_at_s for slot in slots if slot.send_at_s is not None]
    assert len(times) == len(slots)  # a rate times every send
    return [later - earlier for earlier, later in itertools.pairwise(times)]


def test_closed_loop_defaults_to_one_pass_and_sends_when_a_slot_frees() -> None:
    slots = list(plan(LoadShape(concurrency=4), prompt_count=5))
    assert [slot.prompt_index for slot in slots] == [0, 1, 2, 3, 4]
    assert all(slot.send_at_s is None for slot in slots)
    assert not any(slot.warmup for slot in slots)


def test_warmup_comes_first_and_adds_to_the_measured_count() -> None:
    slots = list(plan(LoadShape(concurrency=2, requests=5, warmup_requests=2), prompt_count=3))
    assert [slot.warmup for slot in slots] == [True, True, False, False, False, False, False]
    assert [slot.prompt_index for slot in slots] == [0, 1, 2, 0, 1, 2, 0]
    assert [slot.index for slot in slots] == list(range(7))


def test_shuffled_passes_are_each_a_permutation_and_repeat_with_the_seed() -> None:
    shape = LoadShape(concurrency=1, requests=30, order="shuffled", seed=7)
    order = [slot.prompt_index for slot in plan(shape, prompt_count=10)]
    for start in (0, 10, 20):
        assert sorted(order[start : start + 10]) == list(range(10))
    assert order[:10] != order[10:20]
    assert order == [slot.prompt_index for slot in plan(shape, prompt_count=10)]
    other_seed = shape.model_copy(update={"seed": 8})
    assert order != [slot.prompt_index for slot in plan(other_seed, prompt_count=10)]


def test_poisson_arrivals_have_the_asked_mean_and_unit_coefficient_of_variation() -> None:
    intervals = gaps(LoadShape(rate_per_s=50.0, requests=20_000, seed=1))
    mean = statistics.fmean(intervals)
    assert mean == pytest.approx(1 / 50, rel=0.03)
    assert statistics.pstdev(intervals) / mean == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize(("burstiness", "coefficient_of_variation"), [(0.25, 2.0), (4.0, 0.5)])
def test_gamma_burstiness_changes_spread_not_mean(burstiness: float, coefficient_of_variation: float) -> None:
    """A gamma of shape k has CV 1/sqrt(k): 0.25 is burstier than Poisson, 4 is smoother."""
    intervals = gaps(LoadShape(rate_per_s=20.0, burstiness=burstiness, requests=20_000, seed=3))
    mean = statistics.fmean(intervals)
    assert mean == pytest.approx(1 / 20, rel=0.05)
    assert statistics.pstdev(intervals) / mean == pytest.approx(coefficient_of_variation, rel=0.08)


def test_arrivals_repeat_with_the_seed_and_change_without_it() -> None:
    shape = LoadShape(rate_per_s=10.0, requests=50, seed=5)
    assert gaps(shape) == gaps(shape)
    assert gaps(shape) != gaps(shape.model_copy(update={"seed": 6}))


def test_duration_bounds_open_loop_arrivals() -> None:
    slots = list(plan(LoadShape(rate_per_s=10.0, duration_s=5.0, seed=2), prompt_count=3))
    assert slots[0].send_at_s == 0.0
    assert all(slot.send_at_s is not None and slot.send_at_s <= 5.0 for slot in slots)
    assert 25 <= len(slots) <= 80  # Poisson(50): about 50 +/- 7


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"concurrency": 4, "rate_per_s": 2.0},
        {"concurrency": 4, "max_concurrency": 2},
        {"concurrency": 0},
        {"rate_per_s": -1.0},
    ],
)
def test_contradictory_or_impossible_loads_are_refused(fields: dict) -> None:
    with pytest.raises(ValidationError):
        LoadShape(**fields)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--concurrency", "0"], "error: --concurrency: Input should be greater than or equal to 1, not 0"),
        # 10**20 requests in flight were accepted: the client would have opened that many at once
        (["--concurrency", str(10**20)],
         "error: --concurrency: Input should be less than or equal to 100000, not 100000000000000000000"),
        (["--rate", "3", "--max-concurrency", "100001"],
         "error: --max-concurrency: Input should be less than or equal to 100000, not 100001"),
        (["--concurrency", "2", "--rate", "3"],
         "error: set exactly one of --concurrency (closed loop) or --rate (open loop)"),
        (["--concurrency", "2", "--max-concurrency", "1"],
         "error: --max-concurrency caps a rate; with --concurrency it has no meaning"),
        (["--rate", "3", "--order", "random"],
         "error: --order: Input should be 'inventory' or 'shuffled', not 'random'"),
        (["--rate", "-3"], "error: --rate: Input should be greater than 0, not -3.0"),
        (["--concurrency", "2", "--warmup", "-1"],
         "error: --warmup: Input should be greater than or equal to 0, not -1"),
    ],
)
def test_a_bad_load_on_the_command_line_is_one_line_and_exit_code_2(options: list[str], message: str) -> None:
    args = ["run", "--inventory", "unused", "--out", "unused", "--base-url", "http://127.0.0.1:9", *options]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
