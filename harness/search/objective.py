"""What a load must meet, and whether one probe's requests show that it does, that it does not, or neither.

A percentile objective (`--slo-ttft-ms-p99 2000`) holds when the percentile of the probe's requests is within
the limit; an attainment objective holds when the share of requests meeting per-request limits reaches a
target. A probe measures a sample of requests, so each figure comes with an interval: a seeded bootstrap of
the percentile, a Wilson score interval on the share. A probe *meets* when the whole interval is on the
right side, *fails* when the whole interval is on the wrong side, and is *undecided* when the interval
straddles the objective: more requests, not a guess, decide it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from harness.measure.client import RequestRecord
from harness.measure.stats import tpot_ms, ttft_ms

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
Z_95 = 1.959963984540054  # the standard normal's 97.5th percentile: a two-sided 95 % interval
Latency = Literal["ttft", "tpot", "e2e"]


class Decision(StrEnum):
    MEETS = "meets"
    FAILS = "fails"
    UNDECIDED = "undecided"


class PercentileObjective(BaseModel):
    """`<latency>_ms_p<percentile>` at most `limit_ms`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency: Latency
    percentile: float = Field(gt=0, lt=100)
    limit_ms: float = Field(gt=0)

    @property
    def figure(self) -> str:
        return f"{self.latency}_ms_p{self.percentile:g}"

    @property
    def words(self) -> str:
        return f"p{self.percentile:g} {self.latency.upper()} ≤ {self.limit_ms:,.0f} ms"


# A TTFT objective in the machine's own unit, for a demo or a test that cannot know the CPU beforehand: requests
# that all run see their prefills queue behind each other (p99 832 ms at 5 in flight against 241 ms alone, on 2
# AMD EPYC cores), while one that waits for a seat or for KV blocks waits out another's 300 output tokens
# (300 × 9-13 ms there). Six unloaded prefills lie between on a machine three times faster or slower; a limit
# fixed in ms falls on the wrong side of one of them.
PREFILLS_PER_TTFT_LIMIT = 6


def ttft_objective(unloaded_prefill_ms: float, percentile: float = 99) -> PercentileObjective:
    """p99 TTFT at most six unloaded prefills of the workload's prompt, rounded up to 50 ms."""
    limit_ms = 50 * math.ceil(PREFILLS_PER_TTFT_LIMIT * unloaded_prefill_ms / 50)
    return PercentileObjective(latency="ttft", percentile=percentile, limit_ms=limit_ms)

class AttainmentObjective(BaseModel):
    """At least `target_share` of the requests meet every per-request limit that is set."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    target_share: float = Field(0.95, gt=0, le=1)

    @property
    def figure(self) -> str:
        return "slo_attainment_share"

    @property
    def words(self) -> str:
        limits = [f"{name} ≤ {value:,.0f} ms" for name, value in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms))
                  if value is not None]
        return f"{self.target_share:.0%} of requests with {' and '.join(limits)}"


Objective = PercentileObjective | AttainmentObjective


class Reading(BaseModel):
    """One objective's figure over one probe's requests, its interval, and what it decides."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    figure: str  # the figure's name, unit in it: ttft_ms_p99, slo_attainment_share
    value: float
    low: float
    high: float
    requests: int
    decision: Decision


def latency_values_ms(records: Sequence[RequestRecord], latency: Latency) -> list[float]:
    """The latency of every measured request that succeeded (warm-up requests left out), in ms."""
    values: list[float] = []
    for record in records:
        if record.warmup or record.error_class is not None or record.first_token_s is None:
            continue
        if latency == "ttft":
            values.append(ttft_ms(record))
        elif latency == "e2e":
            values.append((record.end_s - record.scheduled_s) * 1000)
        elif (tpot := tpot_ms(record)) is not None:
            values.append(tpot)
    return values


def bootstrap_percentile(values: Sequence[float], percentile: float, *, seed: int = 0,
                         resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float, float]:
    """The percentile (numpy's linear interpolation, as the run summary computes it) and its 95 % percentile
    bootstrap interval: the percentile of `resamples` seeded resamples with replacement, their 2.5th and
    97.5th percentiles. The interval never leaves the sample's range: a p99 of 8 requests can only be
    bounded by the slowest of them, which is why probes of a high percentile need many requests."""
    array = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    resampled = np.percentile(array[rng.integers(0, len(array), size=(resamples, len(array)))], percentile, axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail])
    return float(np.percentile(array, percentile)), float(low), float(high)


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a share: unlike share ± z·se, it stays within [0, 1] and is not zero-wide
    when every trial succeeded."""
    share = successes / trials
    centre = (share + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def read_objective(objective: Objective, records: Sequence[RequestRecord], *, seed: int = 0) -> Reading | None:
    """The objective's reading over the records; None when no request succeeded."""
    if isinstance(objective, PercentileObjective):
        values = latency_values_ms(records, objective.latency)
        if not values:
            return None
        value, low, high = bootstrap_percentile(values, objective.percentile, seed=seed)
        decision = _decide(high <= objective.limit_ms, low > objective.limit_ms)
        return Reading(figure=objective.figure, value=value, low=low, high=high, requests=len(values),
                       decision=decision)
    met = [_meets(objective, record) for record in records if not record.warmup]
    if not met:
        return None
    low, high = wilson_interval(sum(met), len(met))
    decision = _decide(low >= objective.target_share, high < objective.target_share)
    return Reading(figure=objective.figure, value=sum(met) / len(met), low=low, high=high, requests=len(met),
                   decision=decision)


def _meets(objective: AttainmentObjective, record: RequestRecord) -> bool:
    """A failed request meets no objective; one with a single token has no TPOT to miss."""
    if record.error_class is not None or record.first_token_s is None:
        return False
    if objective.ttft_ms is not None and ttft_ms(record) > objective.ttft_ms:
        return False
    tpot = tpot_ms(record)
    return objective.tpot_ms is None or tpot is None or tpot <= objective.tpot_ms


def _decide(meets: bool, fails: bool) -> Decision:
    return Decision.MEETS if meets else Decision.FAILS if fails else Decision.UNDECIDED


def combined(decisions: Sequence[Decision]) -> Decision:
    """Every objective must hold: one that fails decides; else one undecided (or none read) leaves it undecided."""
    if not decisions:
        return Decision.UNDECIDED
    if Decision.FAILS in decisions:
        return Decision.FAILS
    return Decision.UNDECIDED if Decision.UNDECIDED in decisions else Decision.MEETS
