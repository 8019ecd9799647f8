"""The answer's words on the demo engine's worked numbers: 4 MiB of KV = 32 blocks of 128 tokens (31 usable),
requests of 600 + 300 tokens = 8 blocks = 1,024 block-padded tokens each."""

from __future__ import annotations

from analysis.diagnose import KV_CAPACITY, SCHEDULING, Verdict
from harness.search.answer import (
    EngineFacts,
    SearchAnswer,
    answer_lines,
    cause_words,
    kv_remedy,
    number,
    outputs,
    sequence_remedy,
)
from harness.search.objective import Decision, Reading
from harness.search.probe import Knob

ENGINE = EngineFacts(num_gpu_blocks=32, block_size=128, max_num_seqs=8, kv_cache_bytes=4 * 1024 * 1024,
                     prompt_tokens=[600] * 8, output_tokens=[300] * 8)


def kv_verdict(concurrency: int) -> Verdict:
    return Verdict(run_uuid="r5", bound_by=KV_CAPACITY, figures={
        "concurrency": concurrency, "max_num_seqs": 8, "kv_tokens_needed_padded": concurrency * 1024,
        "kv_cache_tokens_usable": 31 * 128, "preemptions_during_run": 4})


def test_numbers_are_written_for_people() -> None:
    assert [number(17078.0), number(2950.4), number(0.95), number(2.5), number(3)] == \
        ["17,078", "2,950", "0.95", "2.5", "3"]


def test_the_kv_knee_is_named_with_the_blocks_that_show_it() -> None:
    # 5 in flight × 1,024 = 5,120 block-padded tokens against 31 × 128 = 3,968 usable
    assert cause_words(kv_verdict(5)) == ("KV cache capacity: 5 × 1,024 block-padded tokens = 5,120 > 3,968 usable; "
                                          "4 preemptions (run r5)")


def test_the_kv_remedy_is_the_memory_of_the_next_loads_blocks() -> None:
    # 4 MiB / 32 blocks = 131,072 bytes a block; 5 requests × 8 blocks + the null block = 41 blocks = 5,373,952 B
    assert kv_remedy(kv_verdict(5), ENGINE) == (
        "kv_cache_memory_bytes ≥ 5,373,952 (41 blocks of 131,072 bytes, for 5 requests in flight; now 4,194,304 = "
        "32 blocks); gpu_memory_utilization: no GPU memory total known on this device")
    # on an 80 GiB GPU at 0.9: 0.9 + (5,373,952 − 4,194,304) / 85,899,345,920 = 0.9000137, rounded up: 0.901
    on_gpu = ENGINE.model_copy(update={"gpu_memory_total_bytes": 80 * 1024**3, "gpu_memory_utilization": 0.9})
    assert kv_remedy(kv_verdict(5), on_gpu).endswith(", or gpu_memory_utilization ≥ 0.901 on this GPU")


def test_the_sequence_remedy_is_the_max_num_seqs_the_cache_allows() -> None:
    capped = Verdict(run_uuid="r3", bound_by=SCHEDULING, figures={"concurrency": 3, "max_num_seqs": 2})
    # 3 × 8 = 24 blocks ≤ 31 usable, 4 × 8 = 32 > 31: the cache holds 3
    assert sequence_remedy(capped, ENGINE) == ("max_num_seqs 3: the cache holds 3 of these requests (3 × 1,024 "
                                               "block-padded tokens = 3,072 ≤ 3,968 usable); beyond that the KV "
                                               "cache binds")
    # with max_num_seqs already at 4, raising it cannot help: the cache is the limit
    at_four = Verdict(run_uuid="r5", bound_by=SCHEDULING, figures={"concurrency": 5, "max_num_seqs": 4})
    assert sequence_remedy(at_four, ENGINE).startswith("not max_num_seqs alone: the cache holds only 3")


def test_the_first_line_is_the_capacity_and_the_fall_with_its_interval() -> None:
    result = SearchAnswer(
        knob=Knob.CONCURRENCY, objective="p99 TTFT ≤ 2,000 ms", capacity=6, capacity_reading=None, first_short=7,
        first_short_reading=Reading(figure="ttft_ms_p99", value=2950.2, low=2700, high=3200, requests=21,
                                    decision=Decision.FAILS),
        first_short_decision=Decision.FAILS, bound_by=KV_CAPACITY, cause="KV cache capacity: …", remedy=None,
        predicted_knee_concurrency=7, predicted_bound_by="kv_cache", top_of_range=16, probes=4, stopped_reason=None,
        lines=[])
    lines = answer_lines(result)
    assert lines[0] == ("max concurrency meeting p99 TTFT ≤ 2,000 ms: 6; at 7 p99 is 2,950 ms [2,700–3,200] "
                        "over 21 requests")
    assert lines[-1] == "predicted knee concurrency 7 (kv_cache); measured knee 7; 4 probes"
    undecided = result.model_copy(update={"first_short_decision": Decision.UNDECIDED})
    assert answer_lines(undecided)[0].startswith("max concurrency meeting p99 TTFT ≤ 2,000 ms: 6; at 7 undecided: ")


def test_a_rate_answer_writes_its_loads_in_requests_per_second_and_its_knee_as_a_population() -> None:
    result = SearchAnswer(
        knob=Knob.RATE, objective="p99 TTFT ≤ 400 ms", capacity=1.5, capacity_reading=None, first_short=2,
        first_short_reading=Reading(figure="ttft_ms_p99", value=912.4, low=700, high=1040, requests=12,
                                    decision=Decision.FAILS),
        first_short_decision=Decision.FAILS, bound_by=None, cause=None, remedy=None, predicted_knee_concurrency=4,
        predicted_bound_by="kv_cache", top_of_range=3, probes=3, stopped_reason=None, lines=[])
    lines = answer_lines(result)
    assert lines == [
        "max rate meeting p99 TTFT ≤ 400 ms: 1.5 requests/s; at 2 requests/s p99 is 912 ms [700–1,040] over 12 "
        "requests",
        "predicted knee concurrency 4 (kv_cache) in flight, which does not bracket a rate search; measured knee "
        "2 requests/s; 3 probes"]
    # the outputs carry the unit in their names; the predicted knee is a concurrency whatever the knob
    assert {name: value for name, value in outputs(result).items() if "ttft" not in name} == {
        "capacity_rate_per_s": 1.5, "predicted_knee_concurrency": 4, "first_short_rate_per_s": 2, "probes": 3}
