"""Whether a rate search's fall is the client's own cap on requests in flight, not a limit of the server.

Under an open loop capped at C requests in flight, a request that finds every slot taken waits in the
client, and its TTFT counts that wait. While every slot is busy the cap passes C requests per mean time a
request spends at the server, W (Little's law on the slots), so C / W is the most it admits; offered more,
the client's queue grows for as long as the load runs, whatever the server could take. W is measured at
the fallen load itself, where the slots are full, so it is the time at the population the cap allows.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from harness.measure.record import read_requests
from harness.search.driver import SearchTrace, StepResult
from harness.search.probe import Knob


class CapReading(BaseModel):
    """A capped rate's measured requests: how many waited for a slot, and the rate the cap admits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrency: int
    rate_per_s: float
    requests: int
    waited_for_a_slot: int
    longest_slot_wait_ms: float
    server_time_s_mean: float  # from dispatch to the last token: the time a request holds its slot
    run_uuids: list[str]

    @property
    def admitted_per_s(self) -> float:
        return self.max_concurrency / self.server_time_s_mean

    @property
    def binds(self) -> bool:
        """More was offered than the cap admits."""
        return self.rate_per_s > self.admitted_per_s


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
    server_s = [record.end_s - record.dispatch_s for record in finished]
    return CapReading(max_concurrency=cap, rate_per_s=step.value, requests=len(records),
                      waited_for_a_slot=len(waits_s), longest_slot_wait_ms=max(waits_s, default=0.0) * 1000,
                      server_time_s_mean=sum(server_s) / len(server_s),
                      run_uuids=[probe.run_uuid for probe in valid])
