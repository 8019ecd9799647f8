"""When each request should be sent: closed-loop concurrency or seeded open-loop arrivals.

The schedule only yields intended send times; the runner measures latency from them, so time a
request spends waiting for a free slot on the client counts against it (no coordinated omission).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from harness.errors import fields_rule

MAX_IN_FLIGHT = 100_000  # one client process holding more open requests than this is not a load it can keep


class LoadShape(BaseModel):
    """The offered load: how many requests, how fast, in which order."""

    concurrency: int | None = Field(None, ge=1, le=MAX_IN_FLIGHT, description="closed loop: requests kept in flight")
    rate_per_s: float | None = Field(None, gt=0, description="open loop: mean arrivals per second")
    burstiness: float = Field(1.0, gt=0, description="gamma shape of inter-arrival times (1 = Poisson)")
    max_concurrency: int | None = Field(None, ge=1, le=MAX_IN_FLIGHT,
                                        description="cap on in-flight requests under a rate")
    requests: int | None = Field(None, ge=1, description="measured requests (default: one pass over the inventory)")
    duration_s: float | None = Field(None, gt=0, description="stop scheduling after this many seconds")
    warmup_requests: int = Field(0, ge=0, description="requests sent first and left out of the results")
    seed: int = Field(0, ge=0, description="seed for arrivals and shuffling")
    order: Literal["inventory", "shuffled"] = Field("inventory", description="prompt order per pass: inventory or "
                                                    "shuffled")
    think_time_s: float = Field(0.0, ge=0, description="conversations: seconds after a turn ends before the next "
                                "is sent")

    @model_validator(mode="after")
    def one_loop(self) -> LoadShape:
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise fields_rule("set exactly one of {closed} (closed loop) or {open} (open loop)",
                              closed="concurrency", open="rate_per_s")
        if self.concurrency is not None and self.max_concurrency is not None:
            raise fields_rule("{cap} caps a rate; with {closed} it has no meaning",
                              cap="max_concurrency", closed="concurrency")
        return self

    @property
    def in_flight_limit(self) -> int | None:
        return self.concurrency if self.concurrency is not None else self.max_concurrency


@dataclass(frozen=True, slots=True)
class Slot:
    """One request to send. `send_at_s` is an offset from the run's start; None means 'when a slot frees'."""

    index: int
    prompt_index: int
    send_at_s: float | None
    warmup: bool


def prompt_order(shape: LoadShape, prompt_count: int) -> Iterator[int]:
    """Endless passes over the inventory, each in inventory order or its own seeded shuffle."""
    shuffler = random.Random(f"order-{shape.seed}")
    while True:
        indices = list(range(prompt_count))
        if shape.order == "shuffled":
            shuffler.shuffle(indices)
        yield from indices


def plan(shape: LoadShape, prompt_count: int) -> Iterator[Slot]:
    """Warm-up slots first, then the measured ones, until the count or the duration is reached."""
    if prompt_count < 1:
        raise ValueError("the inventory has no prompts")
    measured = shape.requests if shape.requests is not None else (None if shape.duration_s else prompt_count)
    total = None if measured is None else shape.warmup_requests + measured
    arrivals = random.Random(f"arrivals-{shape.seed}")
    send_at_s = 0.0
    for index, prompt_index in enumerate(prompt_order(shape, prompt_count)):
        if total is not None and index >= total:
            return
        if shape.rate_per_s is not None:
            if index > 0:
                scale = 1.0 / (shape.rate_per_s * shape.burstiness)
                send_at_s += arrivals.gammavariate(shape.burstiness, scale)
            if shape.duration_s is not None and send_at_s > shape.duration_s:
                return
        yield Slot(
            index=index,
            prompt_index=prompt_index,
            send_at_s=send_at_s if shape.rate_per_s is not None else None,
            warmup=index < shape.warmup_requests,
        )
