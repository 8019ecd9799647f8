"""Arrival instants and bursts on hand-built records; every expected figure is worked out in the comments."""

from __future__ import annotations

import pytest

from harness.measure.client import RequestRecord
from harness.measure.figures import ScrapeCost
from harness.measure.stats import qualifications
from harness.measure.stream_pacing import longest_silence, request_pacing, run_pacing, silence_threshold_s

from test_stats import record

# Paced: 4 tokens, each 5 ms after the last -> 4 instants, no burst.
PACED = record(1, 0.0, 0.0, [(0.100, 1), (0.105, 1), (0.110, 1), (0.115, 1)], 0.12)
# A backlog: the first token alone, then 5 tokens 20 us apart -> instants [1, 5]: 2 instants for 6 tokens,
# 4 burst tokens, largest burst 5.
BACKLOG = record(2, 0.0, 0.0, [(0.100, 1), (0.200, 1), (0.20002, 1), (0.20004, 1), (0.20006, 1), (0.20008, 1)], 0.21)
# A multi-token chunk is a burst too: 1 token, then one chunk of 3 -> instants [1, 3], 2 burst tokens.
CHUNKED = record(3, 0.0, 0.0, [(0.100, 1), (0.110, 3)], 0.12)


def test_tokens_within_a_millisecond_share_an_instant() -> None:
    assert request_pacing(PACED).arrival_instants == 4 and request_pacing(PACED).burst_tokens == 0
    backlog = request_pacing(BACKLOG)
    assert (backlog.output_tokens, backlog.arrival_instants, backlog.largest_burst_tokens) == (6, 2, 5)
    assert backlog.burst_tokens == 4
    assert request_pacing(CHUNKED).burst_tokens == 2


def test_a_run_paced_one_by_one_is_paced() -> None:
    figures = run_pacing([PACED])
    assert figures.burst_token_fraction == 0.0 and figures.per_token_latency_paced is True
    assert figures.arrival_instants_per_token == 1.0 and figures.requests_burst_delivered == 0


def test_bursts_are_weighted_by_tokens_and_qualify_the_run() -> None:
    figures = run_pacing([PACED, BACKLOG, CHUNKED])
    # burst tokens 0 + 4 + 2 = 6 over gaps (4 - 1) + (6 - 1) + (4 - 1) = 11
    assert figures.burst_token_fraction == pytest.approx(6 / 11)
    # instants 4 + 2 + 2 = 8 over tokens 4 + 6 + 4 = 14
    assert figures.arrival_instants_per_token == pytest.approx(8 / 14)
    assert figures.largest_burst_tokens == 5
    assert figures.requests_burst_delivered == 2  # 4/5 and 2/3 of their gaps, both over a tenth
    assert figures.per_token_latency_paced is False


def test_no_figures_from_single_token_requests() -> None:
    assert run_pacing([record(4, 0.0, 0.0, [(0.1, 1)], 0.1)]).burst_token_fraction is None


def steady(index: int, start_s: float, end_s: float, step_s: float = 0.01) -> RequestRecord:
    """One token every `step_s` from `start_s` up to `end_s`."""
    count = round((end_s - start_s) / step_s) + 1
    return record(index, start_s, start_s, [(start_s + k * step_s, 1) for k in range(count)], end_s)


def test_a_time_no_stream_heard_from_while_one_was_open_is_a_silence() -> None:
    # A streams from 0.1 to 1.0 s; B from 0.5 to 0.6 s and again from 3.0 to 3.1 s as a second request C.
    # Between 1.0 s (A's last token) and 3.0 s (C's first) no stream is open: that quiet is not a silence.
    # Inside A, every token gap is 10 ms; the merged arrivals' longest gap while A is open is 10 ms.
    a, b, c = steady(1, 0.1, 1.0), steady(2, 0.5, 0.6), steady(3, 3.0, 3.1)
    found = longest_silence([a, b, c])
    assert found is not None and found[0] == pytest.approx(0.01)
    assert run_pacing([a, b, c]).server_went_silent is False


def test_a_stop_of_every_open_stream_is_the_servers_and_qualifies_the_run() -> None:
    # A streams every 10 ms from 0.01 to 0.50 s, B 5 ms after it up to 0.495 s; then neither hears anything
    # until A's token at 2.5 s, while both are open: a 2.0 s silence from 0.5 s, more than 50 × the median
    # token gap (50 × 10 ms = 0.5 s) and more than 1 s
    a = record(1, 0.0, 0.0, [(0.01 * k, 1) for k in range(1, 51)] + [(2.5 + 0.01 * k, 1) for k in range(10)], 2.6)
    b = record(2, 0.0, 0.0, [(0.005 + 0.01 * k, 1) for k in range(1, 50)] + [(2.505, 1)], 2.6)
    figures = run_pacing([a, b])
    assert figures.stream_silence_s_max == pytest.approx(2.0) and figures.stream_silence_at_s == pytest.approx(0.5)
    assert silence_threshold_s([a, b]) == 1.0 and figures.server_went_silent is True
    assert any("a stop of the server" in line for line in qualifications(figures, ScrapeCost(), None))


def test_a_silence_is_judged_against_the_runs_own_token_gaps() -> None:
    # tokens every 0.1 s on one stream (a slow engine), and one gap of 2 s: the median gap is 0.1 s, and
    # 50 × 0.1 s = 5 s, so the 2 s gap is slow, not stopped
    slow = record(1, 0.0, 0.0, [(0.1 * k, 1) for k in range(1, 41)] + [(6.0, 1)], 6.0)
    assert silence_threshold_s([slow]) == pytest.approx(5.0)
    assert run_pacing([slow]).stream_silence_s_max == pytest.approx(2.0)
    assert run_pacing([slow]).server_went_silent is False
