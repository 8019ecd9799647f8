"""How a request's tokens reached the client: one by one as the engine made them, or in bursts.

TPOT and ITL only describe the engine when the client saw each token when it was produced. vLLM's API
server merges a request's pending outputs when it falls behind its engine core, and a starved API
server flushes a backlog at once: the client then sees dozens of tokens within microseconds, and the
gaps say nothing about decode speed. Tokens that arrive within `BURST_GAP_MS` of the previous one
share an *arrival instant*; no engine step is that short (on this CPU build a decode step of the tiny
model takes milliseconds, on a GPU the fastest take a few), so every token of an instant after its
first came in a burst. Measured on the CPU engine, a request's gaps fall in two separate groups: under
50 µs (bursts) and over 2 ms (steps), so the threshold's exact value does not move the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.measure.client import RequestRecord
from harness.measure.figures import StreamPacing

BURST_GAP_MS = 1.0
# Above this share of tokens arriving in bursts, TPOT and ITL are not per-token figures: the summary,
# the report and the dashboard say so instead of presenting them. A tenth is well clear of a paced run
# (the emulator and a paced engine run show none) and well below a starved front end (the runs that
# prompted this showed 60-98%).
PACED_BURST_FRACTION_MAX = 0.1


@dataclass(frozen=True)
class RequestPacing:
    output_tokens: int
    arrival_instants: int
    largest_burst_tokens: int  # tokens that arrived at one instant, at the most

    @property
    def burst_tokens(self) -> int:
        """Every token of an instant but its first arrived in a burst."""
        return self.output_tokens - self.arrival_instants


def request_pacing(record: RequestRecord) -> RequestPacing:
    instants: list[int] = []  # tokens per arrival instant
    previous_s: float | None = None
    for arrived_s, tokens in zip(record.chunk_times_s, record.chunk_tokens, strict=True):
        if previous_s is not None and (arrived_s - previous_s) * 1000 < BURST_GAP_MS:
            instants[-1] += tokens
        else:
            instants.append(tokens)
        previous_s = arrived_s
    return RequestPacing(output_tokens=sum(instants), arrival_instants=len(instants),
                         largest_burst_tokens=max(instants, default=0))


def run_pacing(records: Sequence[RequestRecord]) -> StreamPacing:
    """Token-weighted over the requests that streamed two tokens or more (one token has no gap)."""
    pacings = [pacing for pacing in map(request_pacing, records) if pacing.output_tokens >= 2]
    if not pacings:
        return StreamPacing()
    gaps = sum(pacing.output_tokens - 1 for pacing in pacings)
    burst_fraction = sum(pacing.burst_tokens for pacing in pacings) / gaps
    return StreamPacing(
        burst_token_fraction=burst_fraction,
        arrival_instants_per_token=sum(p.arrival_instants for p in pacings) / sum(p.output_tokens for p in pacings),
        largest_burst_tokens=max(pacing.largest_burst_tokens for pacing in pacings),
        requests_burst_delivered=sum(p.burst_tokens / (p.output_tokens - 1) > PACED_BURST_FRACTION_MAX
                                     for p in pacings),
        per_token_latency_paced=burst_fraction <= PACED_BURST_FRACTION_MAX,
    )
