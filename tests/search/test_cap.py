"""A rate search's fall named as the client's cap where the wait for a slot, not the server, breaks the
objective, on requests written as the client writes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_answer import ENGINE

from harness.measure.client import RequestRecord
from harness.schema import RunFile
from harness.search.answer import CAP_BOUND, cap_remedy, knee_cause
from harness.search.cap import cap_reading
from harness.search.driver import ProbeOutcome, SearchPlan, SearchTrace, StepResult
from harness.search.objective import Decision, PercentileObjective
from harness.search.probe import Knob, Probe


def held(index: int, scheduled_s: float, slot_freed_s: float | None) -> RequestRecord:
    """A request that holds its slot 1 s: dispatched when due (or when a slot came free), its first token
    100 ms later, its last 1 s after dispatch."""
    dispatch_s = slot_freed_s if slot_freed_s is not None else scheduled_s
    return RequestRecord(index=index, prompt_id=f"p{index}", warmup=False, max_tokens=4, scheduled_s=scheduled_s,
                         dispatch_s=dispatch_s, slot_freed_s=slot_freed_s, first_token_s=dispatch_s + 0.1,
                         end_s=dispatch_s + 1.0, chunk_times_s=[dispatch_s + 0.1], chunk_tokens=[1])


def capped_trace(tmp_path: Path, limit_ms: float) -> SearchTrace:
    """One failing step at 3 requests/s under a cap of 2, against p99 TTFT ≤ `limit_ms`: requests 0 and 1 take
    the slots at 0 and 0.2 s; request 2 (due 0.5 s) waits until 1.0 s, request 3 (due 0.8 s) until 1.2 s. From
    arrival their TTFTs are 100, 100, 600 and 500 ms; from when their slots came free, 100 ms each."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = [held(0, 0.0, None), held(1, 0.2, None), held(2, 0.5, 1.0), held(3, 0.8, 1.2)]
    (run_dir / RunFile.REQUESTS).write_text("".join(r.model_dump_json() + "\n" for r in records), encoding="utf-8")
    plan = SearchPlan(search_id="s", knob=Knob.RATE, values=[1.0, 2.0, 3.0], max_concurrency=2,
                      objectives=[PercentileObjective(latency="ttft", percentile=99, limit_ms=limit_ms)])
    probe = Probe(search_id="s", step=1, repeat=1, knob=Knob.RATE, value=3.0, max_concurrency=2)
    step = StepResult(step=1, value=3.0, readings=[], decision=Decision.FAILS, probes=[
        ProbeOutcome(probe=probe, run_dir=str(run_dir), run_uuid="r1", invalid_reasons=[], readings=[])])
    return SearchTrace(plan=plan, prediction=None, steps=[step])


def test_a_fall_that_the_wait_for_a_slot_makes_is_bound_by_the_cap(tmp_path: Path) -> None:
    trace = capped_trace(tmp_path, limit_ms=400)
    cap = cap_reading(trace, trace.steps[0])
    assert cap is not None and cap.binds
    # two waited: 1.0 - 0.5 = 500 ms and 1.2 - 0.8 = 400 ms; each holds its slot 1 s: 2 slots / 1 s = 2 per s
    assert (cap.waited_for_a_slot, cap.requests, cap.longest_slot_wait_ms, cap.admitted_per_s) == (2, 4, 500.0, 2.0)
    [from_free] = cap.from_free_slot
    assert [from_free.value, from_free.low, from_free.high] == pytest.approx([100.0, 100.0, 100.0])
    assert from_free.decision == Decision.MEETS
    bound_by, cause, remedy = knee_cause(trace, trace.steps[0], ENGINE)
    assert bound_by == CAP_BOUND
    assert cause == ("max_concurrency (the client's cap): at 3 requests/s 2 of 4 measured requests waited for a "
                     "free slot (longest 500 ms); counted from when each slot came free, p99 is 100 ms [100–100] "
                     "over 4 requests: the wait, not the server, breaks the objective; 2 slots / 1 s a request "
                     "holds one = 2 requests/s, the most the cap admits (runs r1)")
    # the demo engine's cache holds 3 of its requests (24 of 31 usable blocks), max_num_seqs 8: a cap of 3
    assert remedy == ("--max-concurrency 3: the cache holds 3 of these requests at once and max_num_seqs is 8; "
                      "past that the server's limits bind")


def test_a_fall_the_server_makes_itself_is_not_the_caps(tmp_path: Path) -> None:
    trace = capped_trace(tmp_path, limit_ms=50)
    cap = cap_reading(trace, trace.steps[0])
    # counted from the free slot every TTFT is still 100 ms > 50: the server's own part fails the objective
    assert cap is not None and cap.waited_for_a_slot == 2 and not cap.binds
    assert cap.from_free_slot[0].decision == Decision.FAILS
    # and were it the cap's, a cap of 4 is already past the 3 requests the cache holds
    wider = cap.model_copy(update={"max_concurrency": 4})
    assert cap_remedy(wider, ENGINE) == ("not the cap alone: the server seats 3 of these requests at once (the "
                                         "cache holds 3, max_num_seqs is 8), no more than the cap's 4: more slots "
                                         "need the server's limits raised first")
    concurrency = SearchPlan(search_id="s", knob=Knob.CONCURRENCY, values=[1.0], objectives=trace.plan.objectives)
    assert cap_reading(trace.model_copy(update={"plan": concurrency}), trace.steps[0]) is None  # no cap to read
