"""The search's order and decisions on a scripted server: records written as `harness run` writes them, with
TTFT a step function of the load, so every probe's decision is known in advance."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from search_requests import request

from harness.errors import HarnessError
from harness.measure.client import ErrorClass
from harness.measure.record import RunWriter, Slo
from harness.measure.stats import summarize
from harness.predict.population import Bound, KneePrediction
from harness.search.driver import SearchPlan, StepResult, first_indices, next_index, run_search
from harness.search.objective import Decision, PercentileObjective
from harness.search.probe import Knob, Probe

OBJECTIVE = PercentileObjective(latency="ttft", percentile=99, limit_ms=500)


def value_of(step: StepResult | None) -> float | None:
    """The load a step measured; None where the trace has no such step."""
    return None if step is None else step.value


def knee_at(knee: int) -> KneePrediction:
    return KneePrediction(knee_concurrency=knee, bound_by=Bound.KV_CACHE, queue_knee_concurrency=knee,
                          preemption_knee_concurrency=knee - 1,
                          always_fits_up_to_concurrency=knee - 1, max_num_seqs=8, usable_blocks=31, block_size=128)


class ScriptedRunner:
    """Each probe a run directory whose requests take `ttft_ms(probe)`; `broken(probe)` fails 40 % of them."""

    def __init__(self, out: Path, ttft_ms: Callable[[Probe, int], float],
                 broken: Callable[[Probe], bool] = lambda probe: False) -> None:
        self.out, self.ttft_ms, self.broken = out, ttft_ms, broken
        self.probes: list[Probe] = []

    def run(self, probe: Probe) -> Path:
        self.probes.append(probe)
        run_dir = self.out / f"step-{probe.step}-repeat-{probe.repeat}"
        writer = RunWriter(run_dir)
        records = [request(i, 50.0, warmup=True) for i in range(probe.warmup_requests)]
        for i in range(probe.requests or 8):
            failed = self.broken(probe) and i % 5 < 2
            records.append(request(len(records), self.ttft_ms(probe, i),
                                   error=ErrorClass.http_5xx if failed else None))
        for record in records:
            writer.add_request(record)
        summary = summarize(records, [], slo=Slo(), offered_requests_per_s=None, offered_concurrency=int(probe.value),
                            cold=False, max_dispatch_lag_ms=10.0).model_copy(update={"run_id": run_dir.name})
        writer.finish(records, summary)
        return run_dir


def plan(**changes: object) -> SearchPlan:
    return SearchPlan(search_id="s", knob=Knob.CONCURRENCY, values=[float(v) for v in range(1, 9)],
                      objectives=[OBJECTIVE], **changes)


def slow_above(capacity: int) -> Callable[[Probe, int], float]:
    return lambda probe, i: 100.0 if probe.value <= capacity else 1000.0


def test_the_first_probes_are_the_last_load_predicted_to_fit_and_the_predicted_knee() -> None:
    values = [float(v) for v in range(1, 9)]
    assert first_indices(values, knee_at(4), Knob.CONCURRENCY) == [2, 3]  # concurrency 3 and 4
    assert first_indices(values, knee_at(1), Knob.CONCURRENCY) == [0]  # nothing below the lowest load
    assert first_indices(values, knee_at(20), Knob.CONCURRENCY) == [7]  # the knee is past the range: its top
    assert first_indices(values, knee_at(4), Knob.RATE) == []  # a concurrency knee says nothing of a rate
    # then bisection: between index 3 (known to meet) and 8 (past the grid) the midpoint is 5
    assert next_index(3, 8, [], {2, 3}) == 5 and next_index(3, 4, [], {2, 3, 4}) is None


def test_a_right_prediction_is_the_answer_in_two_probes(tmp_path: Path) -> None:
    runner = ScriptedRunner(tmp_path, slow_above(3))
    trace = run_search(plan(), runner, knee_at(4))
    # 3 meets (p99 100 ms, interval [100, 100]), 4 fails ([1,000, 1,000] > 500): neighbours, done
    assert [probe.value for probe in runner.probes] == [3.0, 4.0]
    assert value_of(trace.capacity) == 3.0 and value_of(trace.first_short) == 4.0


def test_a_wrong_prediction_is_corrected_by_bisection_within_log2_of_the_range_plus_two(tmp_path: Path) -> None:
    runner = ScriptedRunner(tmp_path, slow_above(4))
    trace = run_search(plan(), runner, knee_at(4))
    # 3 and 4 meet → bracket (index 3, 8) → 6 fails → (3, 5) → 5 fails → (3, 4): capacity 4
    assert [probe.value for probe in runner.probes] == [3.0, 4.0, 6.0, 5.0]
    assert value_of(trace.capacity) == 4.0 and value_of(trace.first_short) == 5.0
    assert trace.probes_run <= math.ceil(math.log2(8)) + 2
    # every probe: a warm-up wave of `concurrency` requests, then 3 turnovers (at least 8) measured
    assert [(p.warmup_requests, p.requests) for p in runner.probes] == [(3, 9), (4, 12), (6, 18), (5, 15)]


def test_without_a_prediction_the_search_bisects_the_whole_range(tmp_path: Path) -> None:
    runner = ScriptedRunner(tmp_path, slow_above(8))
    trace = run_search(plan(), runner, None)
    # nothing fails: (-1, 8) → 3 (value 4) → (3, 8) → 5 (6) → (5, 8) → 6 (7) → (6, 8) → 7 (8) → (7, 8)
    assert [probe.value for probe in runner.probes] == [4.0, 6.0, 7.0, 8.0]
    assert value_of(trace.capacity) == 8.0 and trace.first_short is None


def test_an_undecided_load_is_repeated_pooled_and_then_reported_undecided(tmp_path: Path) -> None:
    # at 5, one request in ten is slow: p99 of 10 straddles 500 ([100, 1,000]), and pooling 20 or 30 such
    # requests keeps a resample without the slow ones likelier than 2.5 % (0.9²⁰ = 12 %, 0.9³⁰ = 4.2 %)
    def ttft(probe: Probe, i: int) -> float:
        return 1000.0 if probe.value == 5 and i % 10 == 9 else slow_above(5)(probe, i)

    runner = ScriptedRunner(tmp_path, ttft)
    trace = run_search(plan(min_requests=10, turnovers=1), runner, knee_at(6))
    steps = {step.value: step for step in trace.steps}
    assert steps[5.0].decision == Decision.UNDECIDED and len(steps[5.0].probes) == 3  # max_repeats
    assert steps[5.0].readings[0].requests == 30  # the three runs' requests, pooled
    assert value_of(trace.capacity) == 4.0 and value_of(trace.first_short) == 5.0


def test_an_invalid_probe_never_decides_it_is_measured_once_more(tmp_path: Path) -> None:
    # the first run at 6 has 40 % failed requests: invalid (error_rate_fraction 0.4 > 0.05)
    runner = ScriptedRunner(tmp_path, slow_above(4), broken=lambda probe: probe.value == 6 and probe.repeat == 1)
    trace = run_search(plan(), runner, knee_at(4))
    step = next(step for step in trace.steps if step.value == 6.0)
    assert [bool(p.invalid_reasons) for p in step.probes] == [True, False]
    assert "requests failed" in step.probes[0].invalid_reasons[0] and step.decision == Decision.FAILS
    assert value_of(trace.capacity) == 4.0 and trace.stopped_reason is None


def test_a_load_invalid_twice_stops_the_search_with_its_reason(tmp_path: Path) -> None:
    runner = ScriptedRunner(tmp_path, slow_above(4), broken=lambda probe: probe.value == 6)
    trace = run_search(plan(), runner, knee_at(4))
    assert trace.steps[-1].value == 6.0 and trace.steps[-1].decision is None
    assert trace.stopped_reason is not None
    assert "invalid twice" in trace.stopped_reason and "requests failed" in trace.stopped_reason
    assert value_of(trace.capacity) == 4.0 and trace.first_short is None  # the bracket so far: 4 met, 6 unknown


class EngineGoneRunner(ScriptedRunner):
    """Runs as scripted until the load `gone_at`, whose run cannot be made: the engine went away."""

    def __init__(self, out: Path, gone_at: float) -> None:
        super().__init__(out, slow_above(4))
        self.gone_at = gone_at

    def run(self, probe: Probe) -> Path:
        if probe.value == self.gone_at:
            raise HarnessError("cannot reach the engine at http://127.0.0.1:1: connection refused")
        return super().run(probe)


def test_a_probe_that_cannot_be_run_stops_the_search_keeping_the_steps_before(tmp_path: Path) -> None:
    # the prediction's first probes are 3 and 4 (both meet), then bisection's midpoint of (index 3, 8) is 6
    trace = run_search(plan(), EngineGoneRunner(tmp_path, gone_at=6.0), knee_at(4))
    assert [step.value for step in trace.steps] == [3.0, 4.0]
    assert trace.stopped_reason == ("step 3 (concurrency 6) could not be run: cannot reach the engine at "
                                    "http://127.0.0.1:1: connection refused")
    assert value_of(trace.capacity) == 4.0 and trace.first_short is None


def test_a_prediction_made_from_the_first_steps_record_orders_the_rest(tmp_path: Path) -> None:
    runner = ScriptedRunner(tmp_path, slow_above(4))
    seen: list[float] = []

    def from_first(step: StepResult) -> KneePrediction:
        seen.append(step.value)
        return knee_at(5)

    trace = run_search(plan(), runner, None, predict_from=from_first)
    # the lowest load first (1, meets), then the predicted 4 and 5 (meets, fails): the bracket (4, 5) is closed
    assert seen == [1.0] and [probe.value for probe in runner.probes] == [1.0, 4.0, 5.0]
    assert trace.prediction == knee_at(5) and value_of(trace.capacity) == 4.0 and value_of(trace.first_short) == 5.0


def test_a_first_step_that_fails_leaves_nothing_below_it_to_measure(tmp_path: Path) -> None:
    runner = ScriptedRunner(tmp_path, slow_above(0))
    trace = run_search(plan(), runner, None, predict_from=lambda step: knee_at(5))
    # 1 fails: the predicted 4 and 5 lie above a load known to fail, so they are not measured
    assert [probe.value for probe in runner.probes] == [1.0] and trace.capacity is None
