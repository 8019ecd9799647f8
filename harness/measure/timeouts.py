"""Bounded waits for every request, derived from the load when not given.

A request's first byte may come late for a good reason: it queued in the server behind every request in
flight, each producing its output cap. After the first byte, tokens flow once per engine step, so a long
silence means a frozen or dead server. Both waits end the request with a record instead of holding the run.
Before any request, the wait for a server's /health has one default for every command that starts or meets one.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator

from harness.errors import HarnessError
from harness.measure.schedule import LoadShape

# A GPU engine loads (and may first download) its weights and captures CUDA graphs before /health answers.
READY_TIMEOUT_S = 600.0
READ_TIMEOUT_BASE_S = 60.0
# Every request ahead finishing its output cap at 40 tokens/s or better.
READ_TIMEOUT_PER_QUEUED_TOKEN_S = 0.025
STALL_TIMEOUT_BASE_S = 30.0
# An engine step grows with the batch; 0.1 s per sequence in flight is far above any real step.
STALL_TIMEOUT_PER_REQUEST_S = 0.1
# An open loop without a cap may hold this many seconds of arrivals in flight before its read timeout.
UNCAPPED_BACKLOG_S = 60.0


def requests_in_flight(load: LoadShape) -> int:
    """The most requests the load keeps in flight: its cap, or a minute of arrivals under an uncapped rate."""
    if load.in_flight_limit is not None:
        return load.in_flight_limit
    return max(1, math.ceil((load.rate_per_s or 1.0) * UNCAPPED_BACKLOG_S))


def request_timeouts(
    load: LoadShape, longest_output_tokens: int, read_timeout_s: float | None, stall_timeout_s: float | None
) -> tuple[float, float]:
    """(read timeout, stall timeout) in seconds: the ones given, else the defaults this load warrants."""
    in_flight = requests_in_flight(load)
    if read_timeout_s is None:
        read_timeout_s = READ_TIMEOUT_BASE_S + in_flight * longest_output_tokens * READ_TIMEOUT_PER_QUEUED_TOKEN_S
    if stall_timeout_s is None:
        stall_timeout_s = STALL_TIMEOUT_BASE_S + in_flight * STALL_TIMEOUT_PER_REQUEST_S
    return read_timeout_s, stall_timeout_s


def seconds_to_wait(value: float) -> float:
    """A wait or deadline as a model field (a pydantic validator: a refusal is a ValueError saying why)."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("must be a positive number of seconds")
    return value


# A wait or deadline: 0 or less would give up at once, NaN never, infinity would hold a dead server forever.
PositiveSeconds = Annotated[float, AfterValidator(seconds_to_wait)]


def positive_seconds(value: float, option: str) -> float:
    """`seconds_to_wait` for an option that is not a model field: the refusal is one line naming it."""
    try:
        return seconds_to_wait(value)
    except ValueError as error:
        raise HarnessError(f"{option}: {error}, not {value}") from None
