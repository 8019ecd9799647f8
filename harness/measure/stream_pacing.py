"""How a request's tokens reached the client: one by one as the engine made them, or in bursts.

TPOT and ITL only describe the engine when the client saw each token when it was produced. vLLM's API
server merges a request's pending outputs when it falls behind its engine core, and a starved API
server flushes a backlog at once: the client then sees dozens of tokens within microseconds, and the
gaps say nothing about decode speed. Tokens that arrive within `BURST_GAP_MS` of the previous one
share an *arrival instant*; no engine step is that short (on this CPU build a decode step of the tiny
model takes milliseconds, on a GPU the fastest take a few), so every token of an instant after its
first came in a burst. Measured on the CPU engine, a request's gaps fall in two separate groups: under
50 µs (bursts) and over 2 ms (steps), so the threshold's exact value does not move the figures.

A *silence* is the other failure: a time in which no token reached any stream although a stream had
started and not ended. The engine makes a token for every running request at every step, and since
vLLM V1 splits long prefills into chunks that share a step with the decodes, a silence many times the
run's typical token gap is a server (or the machine under it) that stopped: its latencies then measure
the stop, not the load. On the demo's engine one round of a repeatability check went silent for 5.9 s
while its client's loop was healthy; that round alone set its figures off the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.measure.client import RequestRecord
from harness.measure.figures import StreamPacing

BURST_GAP_MS = 1.0
# Above this share of tokens arriving in bursts, TPOT and ITL are not per-token figures: the summary,
# the report and the dashboard say so instead of presenting them. A tenth is well clear of a paced run
# (the emulator and a paced engine run show none) and well below a starved front end (the runs that
# prompted this showed 60-98%).
PACED_BURST_FRACTION_MAX = 0.1
# A silence counts as the server's stop when it lasts this many times the run's median token gap (a decode
# step), and at least SILENCE_S_MIN: a step that carries a prefill chunk takes a few to a few tens of decode
# steps' time, and no step of a running engine is longer. The median, not a tail: the silence's own gaps
# (one per open stream) are a tail of a short run.
SILENCE_GAP_FACTOR = 50.0
SILENCE_S_MIN = 1.0


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


def longest_silence(records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """(length, start) of the longest gap between two tokens to any streams, during which some stream had
    its first token before the gap and a later one after it; None when no stream has two chunks."""
    streams = sorted((r.chunk_times_s[0], r.chunk_times_s[-1]) for r in records if len(r.chunk_times_s) >= 2)
    if not streams:
        return None
    arrivals = np.sort(np.concatenate([r.chunk_times_s for r in records if r.chunk_times_s]))
    starts, gaps = arrivals[:-1], np.diff(arrivals)
    firsts = np.array([first for first, _ in streams])
    latest_last = np.maximum.accumulate(np.array([last for _, last in streams]))  # of streams begun so far
    begun = np.searchsorted(firsts, starts, side="right") - 1  # the last stream begun by each gap's start
    open_across = (begun >= 0) & (latest_last[np.clip(begun, 0, None)] >= starts + gaps)
    if not open_across.any():
        return None
    longest = int(np.argmax(np.where(open_across, gaps, -1.0)))
    return float(gaps[longest]), float(starts[longest])


def silence_threshold_s(records: Sequence[RequestRecord]) -> float:
    """SILENCE_GAP_FACTOR × the median of the streams' own token gaps, and at least SILENCE_S_MIN."""
    gaps = [np.diff(r.chunk_times_s) for r in records if len(r.chunk_times_s) >= 2]
    if not gaps:
        return SILENCE_S_MIN
    return max(SILENCE_S_MIN, SILENCE_GAP_FACTOR * float(np.median(np.concatenate(gaps))))


def run_pacing(records: Sequence[RequestRecord]) -> StreamPacing:
    """Token-weighted over the requests that streamed two tokens or more (one token has no gap)."""
    pacings = [pacing for pacing in map(request_pacing, records) if pacing.output_tokens >= 2]
    if not pacings:
        return StreamPacing()
    silence = longest_silence(records)
    gaps = sum(pacing.output_tokens - 1 for pacing in pacings)
    burst_fraction = sum(pacing.burst_tokens for pacing in pacings) / gaps
    return StreamPacing(
        burst_token_fraction=burst_fraction,
        arrival_instants_per_token=sum(p.arrival_instants for p in pacings) / sum(p.output_tokens for p in pacings),
        largest_burst_tokens=max(pacing.largest_burst_tokens for pacing in pacings),
        requests_burst_delivered=sum(p.burst_tokens / (p.output_tokens - 1) > PACED_BURST_FRACTION_MAX
                                     for p in pacings),
        per_token_latency_paced=burst_fraction <= PACED_BURST_FRACTION_MAX,
        stream_silence_s_max=silence[0] if silence else None,
        stream_silence_at_s=silence[1] if silence else None,
        server_went_silent=silence is not None and silence[0] > silence_threshold_s(records),
    )
