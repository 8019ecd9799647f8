"""The one-limit comparator: it refuses confounded sweeps by name and aggregates repeated points."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.compare import REAL, SPREAD_UNKNOWN, WITHIN_SPREAD, compare_one_limit, point_differences
from analysis.sources import runs_from_directories
from analysis.table import RunTable, build_table
from harness.errors import HarnessError

from run_records import write_run


def table_of(root: Path) -> RunTable:
    return build_table(runs_from_directories([root]))


def test_repeated_points_are_aggregated_with_their_spread(tmp_path: Path) -> None:
    first = write_run(tmp_path, limits={"max_num_seqs": 2}, ttft_ms=40.0)
    second = write_run(tmp_path, limits={"max_num_seqs": 2}, ttft_ms=60.0)
    third = write_run(tmp_path, limits={"max_num_seqs": 4}, ttft_ms=100.0, tpot_ms=30.0)
    comparison = compare_one_limit(table_of(tmp_path), "max_num_seqs")

    assert list(comparison.points.index) == [2, 4]
    two, four = comparison.points.loc[2], comparison.points.loc[4]
    assert two["n"] == 2 and four["n"] == 1
    assert set(two["run_uuids"].split(", ")) == {first.name, second.name}
    assert four["run_uuids"] == third.name
    # every request's TTFT is exactly the constructed one, so each run's p99 is it too
    assert two["ttft_ms_p99_mean"] == pytest.approx(50.0)
    assert (two["ttft_ms_p99_min"], two["ttft_ms_p99_max"]) == pytest.approx((40.0, 60.0))
    assert four["tpot_ms_p50_mean"] == pytest.approx(30.0)
    assert list(comparison.runs["max_num_seqs"]) == [2, 2, 4]
    assert comparison.held_fixed["concurrency"] == 4 and comparison.held_fixed["image"] == "vllm-cpu:0.32.0"
    assert "max_num_seqs" not in comparison.held_fixed


def test_a_limit_held_as_the_text_it_was_given_orders_as_its_number(tmp_path: Path) -> None:
    """A run the Polyaxon API has not compiled yet holds its -P value as given: "16" sorts after 4, not before."""
    write_run(tmp_path, limits={"max_num_seqs": "16"})
    write_run(tmp_path, limits={"max_num_seqs": 4})
    comparison = compare_one_limit(table_of(tmp_path), "max_num_seqs")
    assert list(comparison.points.index) == [4, 16]


def test_an_input_held_as_the_text_it_was_given_is_the_same_input(tmp_path: Path) -> None:
    """Of two points, one not yet compiled by the Polyaxon API: its max_num_batched_tokens "2048" is 2048."""
    write_run(tmp_path, limits={"max_num_seqs": 2, "max_num_batched_tokens": "2048"})
    write_run(tmp_path, limits={"max_num_seqs": 4, "max_num_batched_tokens": 2048})
    assert list(compare_one_limit(table_of(tmp_path), "max_num_seqs").points.index) == [2, 4]
    write_run(tmp_path, limits={"max_num_seqs": 8, "max_num_batched_tokens": "4096"})
    with pytest.raises(HarnessError, match=r"max_num_batched_tokens: 2048 in run .*; 4096 in run"):
        compare_one_limit(table_of(tmp_path), "max_num_seqs")


def test_an_input_written_as_digits_past_any_float_is_compared_as_its_text(tmp_path: Path) -> None:
    a = write_run(tmp_path, limits={"max_num_seqs": 2, "model_seed": "9" * 400})
    b = write_run(tmp_path, limits={"max_num_seqs": 4})
    with pytest.raises(HarnessError) as refused:
        compare_one_limit(table_of(tmp_path), "max_num_seqs")
    assert f"model_seed: '{'9' * 400}' in run {a.name}; 0 in run {b.name}" in str(refused.value)


@pytest.mark.parametrize("damaged", ["x", [2], {"value": 2}], ids=["a word", "a list", "a mapping"])
def test_a_limit_that_is_not_one_kind_of_value_is_refused_naming_each_run(tmp_path: Path, damaged: object) -> None:
    odd = write_run(tmp_path, limits={"max_num_seqs": damaged})
    plain = write_run(tmp_path, limits={"max_num_seqs": 2})
    with pytest.raises(HarnessError) as refused:
        compare_one_limit(table_of(tmp_path), "max_num_seqs")
    message = str(refused.value)
    assert message.startswith("limit 'max_num_seqs' holds values that cannot be ordered (")
    assert f"2 in run {plain.name}" in message and f"in run {odd.name}" in message and "\n" not in message


def test_refuses_runs_that_differ_in_more_than_the_limit_naming_each_difference(tmp_path: Path) -> None:
    a = write_run(tmp_path, limits={"max_num_seqs": 2}, seed=0)
    b = write_run(tmp_path, limits={"max_num_seqs": 4, "image": "vllm-cpu:0.33.0"}, seed=1)
    with pytest.raises(HarnessError) as refused:
        compare_one_limit(table_of(tmp_path), "max_num_seqs")
    message = str(refused.value)
    assert message.startswith("runs differ in more than 'max_num_seqs': ")
    assert f"seed: 0 in run {a.name}; 1 in run {b.name}" in message
    assert f"image: 'vllm-cpu:0.32.0' in run {a.name}; 'vllm-cpu:0.33.0' in run {b.name}" in message
    assert "concurrency" not in message and "\n" not in message


def test_an_input_one_run_lacks_is_a_difference_too(tmp_path: Path) -> None:
    without = write_run(tmp_path, limits={"max_num_seqs": 2})
    batched = write_run(tmp_path, limits={"max_num_seqs": 4, "max_num_batched_tokens": 2048})
    with pytest.raises(HarnessError) as refused:
        compare_one_limit(table_of(tmp_path), "max_num_seqs")
    assert f"2048 in run {batched.name}" in str(refused.value)
    assert f"missing in run {without.name}" in str(refused.value)


def test_unknown_limit_and_service_uuid_handling(tmp_path: Path) -> None:
    write_run(tmp_path, limits={"max_num_seqs": 2}, service_uuid="s1")
    write_run(tmp_path, limits={"max_num_seqs": 4}, service_uuid="s2")
    table = table_of(tmp_path)
    with pytest.raises(HarnessError, match=r"unknown limit 'max_num_sequences': the runs' inputs are .*max_num_seqs"):
        compare_one_limit(table, "max_num_sequences")
    # each point has its own service run: that is identity, not a confound
    assert list(compare_one_limit(table, "max_num_seqs").points["n"]) == [1, 1]


def test_a_difference_is_real_only_beyond_the_spread_of_repeats(tmp_path: Path) -> None:
    # max_num_seqs 2: TTFT 40 and 60 ms; 4: 55 and 65 ms (overlaps [40, 60]); 8: 90 and 100 ms (clear of [55, 65]);
    # 16: one run, no range
    for seqs, ttfts in ((2, (40.0, 60.0)), (4, (55.0, 65.0)), (8, (90.0, 100.0)), (16, (200.0,))):
        for ttft in ttfts:
            write_run(tmp_path, limits={"max_num_seqs": seqs}, ttft_ms=ttft)
    differences = point_differences(compare_one_limit(table_of(tmp_path), "max_num_seqs"), ("ttft_ms_p99",))
    assert list(differences["max_num_seqs"]) == ["2 → 4", "4 → 8", "8 → 16"]
    assert list(differences["difference"]) == [WITHIN_SPREAD, REAL, SPREAD_UNKNOWN]
    assert list(differences["mean"]) == ["50 → 60", "60 → 95", "95 → 200"]


def test_a_sweep_without_repeats_says_once_that_no_spread_is_known(tmp_path: Path) -> None:
    from analysis.report import differences_section

    for seqs, ttft in ((2, 17078.3), (4, 0.0123)):
        write_run(tmp_path, limits={"max_num_seqs": seqs}, ttft_ms=ttft)
    section = differences_section(compare_one_limit(table_of(tmp_path), "max_num_seqs"))
    # one sentence in place of a row per figure that would each say "spread unknown"
    assert section.table is None and "no point was measured more than once" in section.text


def test_figures_are_written_for_people() -> None:
    from analysis.compare import people_number

    assert [people_number(value) for value in (17078.3, 123.45, 0.95, 0.0000123)] == \
        ["17,078", "123.5", "0.95", "0.0000123"]
