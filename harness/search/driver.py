"""The search: probes bracketed by the prediction, then bisection, deciding only on sound, decided probes.

Order. The first two probes are the last load predicted to fit and the predicted knee itself, always both:
when the prediction is right they are the answer and its fall, and whatever happens the prediction is
checked against a measured point. Then bisection between the highest load known to meet the objective
and the lowest known not to, until they are neighbours on the knob's grid. A step is a load; a step that
fails or stays undecided bounds the search from above, so the capacity claimed is always a load that was
measured to meet the objective.

A rate search is not bracketed. The predicted knee is a population of requests in flight; the rate that
keeps it in flight is that population over each request's time in the system (Little's law), and that
time grows with the population on the way to the knee (larger batches decode slower) and with the cap's
queue past it: a probe below the knee measures too short a time and would put the knee's rate too high,
by as much as the batch slows; and random arrivals pass the knee's population before their mean reaches
it. So a rate search bisects its range from the middle, and the answer prints
the predicted knee as a concurrency beside the measured rate.

A step's repeats. A probe whose interval straddles the objective is measured again at the same load and
its requests are pooled with the earlier ones, until the pooled interval decides or `max_repeats` valid
runs were made; then the step is *undecided*. An invalid probe never decides: it is measured once more, and
a second invalid run at the same step stops the search with its reasons. A probe that cannot be run at all
(its runner raises: the engine died, the API refused the run) stops it too; the steps measured before stay.

Steady state. Each probe first sends `warmup_requests` requests left out of every figure: under a closed
loop, the first wave of `concurrency` requests, which start together and whose prefills queue behind each
other as no later request's do; under a rate, the in-flight cap's worth (or one second of arrivals). Then it
measures `turnovers` × the in-flight population (at least `min_requests`): every slot is refilled that
many times after the warm-up wave, so the queue and the cache are measured in the state the load keeps
them in, not on the way there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import HarnessError
from harness.measure.client import RequestRecord
from harness.predict.population import KneePrediction
from harness.search.objective import Decision, Objective, Reading, combined, read_objective
from harness.search.probe import Knob, Probe, ProbeRunner
from harness.search.validity import ProbeRecord, read_probe

INVALID_RUNS_PER_STEP = 2  # an invalid probe is measured once more; a second invalid run stops the search


class SearchPlan(BaseModel):
    """What is searched, over which loads, against which objectives, at what cost per step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    search_id: str
    knob: Knob
    values: list[float] = Field(min_length=1)  # the knob's grid, ascending
    objectives: list[Objective] = Field(min_length=1)
    max_repeats: int = Field(3, ge=1)  # valid runs per step before it is reported undecided
    turnovers: int = Field(3, ge=1)
    min_requests: int = Field(8, ge=1)
    max_concurrency: int | None = Field(None, ge=1)  # under a rate: the cap on requests in flight
    cold: bool = False
    seed: int = 0

    @property
    def most_in_flight(self) -> int:
        """The most requests the searched loads put in flight: the top concurrency, or a rate's cap."""
        if self.knob == Knob.CONCURRENCY:
            return int(self.values[-1])
        return self.max_concurrency or math.ceil(self.values[-1])

    def load(self, value: float) -> tuple[int, int]:
        """(measured requests, warm-up requests) for a probe at `value` (see the module's note)."""
        if self.knob == Knob.CONCURRENCY:
            population = warmup = int(value)
        else:
            population = self.max_concurrency or math.ceil(value)
            warmup = self.max_concurrency or math.ceil(value)
        return max(self.min_requests, self.turnovers * population), warmup


class ProbeOutcome(BaseModel):
    """One run of one step: its id, its validity, and its own readings (before pooling)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    probe: Probe
    run_dir: str
    run_uuid: str
    invalid_reasons: list[str]
    readings: list[Reading]


class StepResult(BaseModel):
    """One load, its runs, and what their pooled requests decide (None: no valid run)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    value: float
    probes: list[ProbeOutcome]
    readings: list[Reading]  # over every valid repeat's requests
    decision: Decision | None
    stopped_reason: str | None = None


class SearchTrace(BaseModel):
    """Every step in the order measured, the prediction it started from, and why it stopped early, if it did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: SearchPlan
    prediction: KneePrediction | None
    steps: list[StepResult]
    stopped_reason: str | None = None

    def by_value(self) -> list[StepResult]:
        return sorted(self.steps, key=lambda step: step.value)

    @property
    def capacity(self) -> StepResult | None:
        """The highest load measured to meet every objective, below every load that did not."""
        ceiling = self.first_short
        met = [step for step in self.steps if step.decision == Decision.MEETS
               and (ceiling is None or step.value < ceiling.value)]
        return max(met, key=lambda step: step.value, default=None)

    @property
    def first_short(self) -> StepResult | None:
        """The lowest load that failed an objective or stayed undecided."""
        short = [step for step in self.steps if step.decision in (Decision.FAILS, Decision.UNDECIDED)]
        return min(short, key=lambda step: step.value, default=None)

    @property
    def probes_run(self) -> int:
        return sum(len(step.probes) for step in self.steps)


def first_indices(values: Sequence[float], prediction: KneePrediction | None, knob: Knob) -> list[int]:
    """The grid indices of the last load predicted to fit and of the predicted knee, where they are on it."""
    if prediction is None or prediction.knee_concurrency is None or knob != Knob.CONCURRENCY:
        return []
    knee = next((index for index, value in enumerate(values) if value >= prediction.knee_concurrency), None)
    if knee is None:
        return [len(values) - 1]
    return [index for index in (knee - 1, knee) if index >= 0]


def next_index(below: int, above: int, queue: list[int], measured: set[int]) -> int | None:
    """The next grid index to measure: the prediction's first probes while they lie inside the bracket, then
    the bracket's midpoint (`below` the highest index known to meet, or -1; `above` the lowest known not to,
    or the grid's length). A predicted knee above a load that already failed has nothing left to show."""
    while queue:
        index = queue.pop(0)
        if index not in measured and below < index < above:
            return index
    if above - below > 1:
        return (below + above) // 2
    return None


def run_search(plan: SearchPlan, runner: ProbeRunner, prediction: KneePrediction | None,
               on_step: Callable[[StepResult], None] | None = None, *,
               predict_from: Callable[[StepResult], KneePrediction | None] | None = None) -> SearchTrace:
    """Measure steps until the bracket closes, an invalid step stops the search, or a probe cannot be run.

    `predict_from`: where nothing was predicted before the first run (the engine's capacity is known only
    from a probe's record), the lowest load is measured first and the prediction made from its step."""
    below, above = -1, len(plan.values)
    queue, measured = first_indices(plan.values, prediction, plan.knob), set[int]()
    if prediction is None and predict_from is not None:
        queue = [0]
    steps: list[StepResult] = []
    while (index := next_index(below, above, queue, measured)) is not None:
        measured.add(index)
        try:
            step = measure_step(plan, runner, len(steps) + 1, plan.values[index])
        except HarnessError as error:  # the probe's run could not be made: the engine is gone, the API refused
            reason = f"step {len(steps) + 1} ({plan.knob.at(plan.values[index])}) could not be run: {error}"
            return SearchTrace(plan=plan, prediction=prediction, steps=steps, stopped_reason=reason)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if step.stopped_reason is not None:
            return SearchTrace(plan=plan, prediction=prediction, steps=steps, stopped_reason=step.stopped_reason)
        if step.decision == Decision.MEETS:
            below = max(below, index)
        else:
            above = min(above, index)
        if predict_from is not None and prediction is None and len(steps) == 1:
            prediction = predict_from(step)
            queue = [index for index in first_indices(plan.values, prediction, plan.knob) if below < index < above]
    return SearchTrace(plan=plan, prediction=prediction, steps=steps)


def measure_step(plan: SearchPlan, runner: ProbeRunner, step: int, value: float) -> StepResult:
    """Runs at one load until their pooled requests decide, the repeats run out, or two runs were invalid."""
    requests, warmup = plan.load(value)
    outcomes: list[ProbeOutcome] = []
    pooled: list[RequestRecord] = []
    readings: list[Reading] = []
    decision: Decision | None = None
    while True:
        probe = Probe(search_id=plan.search_id, step=step, repeat=len(outcomes) + 1, knob=plan.knob, value=value,
                      requests=requests, warmup_requests=warmup, max_concurrency=plan.max_concurrency)
        record = read_probe(Path(runner.run(probe)), plan.objectives, cold=plan.cold)
        outcomes.append(_outcome(plan, probe, record))
        invalid = [outcome for outcome in outcomes if outcome.invalid_reasons]
        if len(invalid) >= INVALID_RUNS_PER_STEP:
            reason = (f"step {step} ({plan.knob.at(value)}) invalid twice: run {record.run_uuid}: "
                      + "; ".join(record.invalid_reasons))
            return StepResult(step=step, value=value, probes=outcomes, readings=readings, decision=None,
                              stopped_reason=reason)
        if not record.valid:
            continue
        pooled += record.requests
        readings = _readings(plan, pooled)
        decision = combined([reading.decision for reading in readings])
        if decision != Decision.UNDECIDED or len(outcomes) - len(invalid) >= plan.max_repeats:
            return StepResult(step=step, value=value, probes=outcomes, readings=readings, decision=decision)


def _readings(plan: SearchPlan, records: Sequence[RequestRecord]) -> list[Reading]:
    readings = [read_objective(objective, records, seed=plan.seed) for objective in plan.objectives]
    return [reading for reading in readings if reading is not None]


def _outcome(plan: SearchPlan, probe: Probe, record: ProbeRecord) -> ProbeOutcome:
    return ProbeOutcome(probe=probe, run_dir=record.run_dir, run_uuid=record.run_uuid,
                        invalid_reasons=record.invalid_reasons,
                        readings=_readings(plan, record.requests) if record.valid else [])
