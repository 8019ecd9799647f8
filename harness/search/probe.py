"""One probe of a capacity search: a real run at one load, left as the record `harness run` leaves.

Where the probe runs is a runner's business (one engine started here, or an ordinary run of
experiment.yaml on a Polyaxon API); the search reads only the record directory a runner returns.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict


class Knob(StrEnum):
    """The load a search turns: requests in flight (closed loop) or arrivals per second (open loop)."""

    CONCURRENCY = "concurrency"
    RATE = "rate"

    @property
    def unit(self) -> str:
        """What follows a load's value when it is written: nothing for a count of requests in flight."""
        return "" if self == Knob.CONCURRENCY else " requests/s"

    def at(self, value: float) -> str:
        """A load in a reason's words: 'concurrency 4', 'rate 1.5 requests/s'."""
        return f"{self.value} {value:g}{self.unit}"


class Probe(BaseModel):
    """Which step of which search, at which load: what a probe's run is tagged with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    search_id: str
    step: int  # counted from 1 in the order the search measured
    repeat: int  # counted from 1: a probe measured again (undecided or invalid) keeps its step
    knob: Knob
    value: float
    # How much the run sends: measured requests after the warm-up ones, which start the load and are left out
    # of its figures; under a rate, the cap on requests in flight. None: the runner's own default.
    requests: int | None = None
    warmup_requests: int = 0
    max_concurrency: int | None = None

    def tags(self) -> list[str]:
        return [f"search-{self.search_id}", f"search-step-{self.step}", f"search-repeat-{self.repeat}"]


class ProbeRunner(Protocol):
    def run(self, probe: Probe) -> Path:
        """Measure one probe and return its run directory; the limits of the server stay as they are."""
