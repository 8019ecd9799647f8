"""Whether a rate search's fall is the client's own cap on requests in flight, not a limit of the server.

Under an open loop capped at C requests in flight, a request that finds every slot taken waits in the
client, and its TTFT counts that wait. The cap is the knee where the objectives, read with each request's
latency counted from when its slot came free instead of from its arrival, no longer fail: what the server
did meets them, and the wait for a slot is what breaks them. That holds both past saturation and short of
it: while every slot is busy the cap passes C requests per mean time a request holds one, W (Little's
law on the slots), so offered more than C / W the client's queue grows as long as the load runs; offered
a little less, random arrivals still queue for long stretches, as at any server near full use.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from harness.measure.record import read_requests
from harness.search.driver import SearchTrace, StepResult
from harness.search.objective import Decision, Reading, combined, read_objective
from harness.search.probe import Knob


class CapReading(BaseModel):
    """A capped rate's measured requests: how many waited for a slot, the rate the cap admits, and what the
    objectives read with each latency counted from when its slot came free."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrency: int
    rate_per_s: float
    requests: int
    waited_for_a_slot: int
    longest_slot_wait_ms: float
    server_time_s_mean: float  # from dispatch to the last token: the time a request holds its slot
    from_free_slot: list[Reading]  # each objective over the same requests, counted from when the slot came free
    run_uuids: list[str]

    @property
    def admitted_per_s(self) -> float:
        return self.max_concurrency / self.server_time_s_mean

    @property
    def binds(self) -> bool:
        """Requests waited, and without the wait the objectives no longer fail."""
        decisions = [reading.decision for reading in self.from_free_slot]
        return self.waited_for_a_slot > 0 and bool(decisions) and combined(decisions) != Decision.FAILS


def cap_reading(trace: SearchTrace, step: StepResult | None) -> CapReading | None:
    """The cap at a rate search's step, over its valid runs' measured requests; None without a cap or a request
    that finished."""
    cap = trace.plan.max_concurrency
    if trace.plan.knob != Knob.RATE or step is None or cap is None:
        return None
    valid = [probe for probe in step.probes if not probe.invalid_reasons]
    records = [record for probe in valid for record in read_requests(Path(probe.run_dir)) if not record.warmup]
    finished = [record for record in records if record.error_class is None and record.first_token_s is not None]
    if not finished:
        return None
    waits_s = [record.slot_freed_s - record.scheduled_s for record in records
               if record.slot_freed_s is not None and record.slot_freed_s > record.scheduled_s]
    from_free = [record.model_copy(update={"scheduled_s": max(record.scheduled_s, record.slot_freed_s)})
                 if record.slot_freed_s is not None else record for record in records]
    readings = [read_objective(objective, from_free, seed=trace.plan.seed) for objective in trace.plan.objectives]
    server_s = [record.end_s - record.dispatch_s for record in finished]
    return CapReading(max_concurrency=cap, rate_per_s=step.value, requests=len(records),
                      waited_for_a_slot=len(waits_s), longest_slot_wait_ms=max(waits_s, default=0.0) * 1000,
                      server_time_s_mean=sum(server_s) / len(server_s),
                      from_free_slot=[reading for reading in readings if reading is not None],
                      run_uuids=[probe.run_uuid for probe in valid])
