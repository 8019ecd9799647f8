"""Arrival instants and bursts on hand-built records; every expected figure is worked out in the comments."""

from __future__ import annotations

import pytest

from harness.measure.stream_pacing import request_pacing, run_pacing

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
    assert figures["burst_token_fraction"] == 0.0 and figures["per_token_latency_paced"] is True
    assert figures["arrival_instants_per_token"] == 1.0 and figures["requests_burst_delivered"] == 0


def test_bursts_are_weighted_by_tokens_and_qualify_the_run() -> None:
    figures = run_pacing([PACED, BACKLOG, CHUNKED])
    # burst tokens 0 + 4 + 2 = 6 over gaps (4 - 1) + (6 - 1) + (4 - 1) = 11
    assert figures["burst_token_fraction"] == pytest.approx(6 / 11)
    # instants 4 + 2 + 2 = 8 over tokens 4 + 6 + 4 = 14
    assert figures["arrival_instants_per_token"] == pytest.approx(8 / 14)
    assert figures["largest_burst_tokens"] == 5
    assert figures["requests_burst_delivered"] == 2  # 4/5 and 2/3 of their gaps, both over a tenth
    assert figures["per_token_latency_paced"] is False


def test_no_figures_from_single_token_requests() -> None:
    assert run_pacing([record(4, 0.0, 0.0, [(0.1, 1)], 0.1)])["burst_token_fraction"] is None
