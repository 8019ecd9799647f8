"""Request timeouts derived from the load; every expected figure is worked out in the comments."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from harness.cli import app
from harness.measure.run_options import RunOptions
from harness.measure.schedule import LoadShape
from harness.measure.timeouts import request_timeouts


def test_a_closed_loop_waits_for_every_request_in_flight_to_produce_its_cap() -> None:
    # 8 in flight × 300 tokens × 0.025 s = 60 s, plus 60 s: 120 s to the first byte.
    # Stall: 30 s + 8 × 0.1 s = 30.8 s.
    assert request_timeouts(LoadShape(concurrency=8), 300, None, None) == pytest.approx((120.0, 30.8))


def test_an_uncapped_rate_holds_a_minute_of_arrivals_in_flight() -> None:
    # 2 req/s × 60 s = 120 in flight: 60 + 120 × 10 × 0.025 = 90 s; stall 30 + 12 = 42 s.
    assert request_timeouts(LoadShape(rate_per_s=2.0), 10, None, None) == pytest.approx((90.0, 42.0))
    # Under a cap of 4: 60 + 4 × 10 × 0.025 = 61 s; stall 30.4 s.
    capped = LoadShape(rate_per_s=2.0, max_concurrency=4)
    assert request_timeouts(capped, 10, None, None) == pytest.approx((61.0, 30.4))


def test_given_timeouts_are_kept_and_bad_ones_refused_by_their_field() -> None:
    assert request_timeouts(LoadShape(concurrency=8), 300, 5.0, 1.5) == (5.0, 1.5)
    for field, value in (("read_timeout_s", 0.0), ("stall_timeout_s", float("inf")), ("ready_timeout_s", -1.0)):
        with pytest.raises(ValidationError) as refused:
            RunOptions.model_validate({"inventory": "x", "base_url": "http://h", "load": LoadShape(concurrency=8),
                                       field: value})
        first = refused.value.errors()[0]
        assert (first["loc"], first["msg"]) == ((field,), "Value error, must be a positive number of seconds")


@pytest.mark.parametrize("command", ["run", "sweep", "serve", "run-local", "demo"])
def test_every_command_that_runs_something_documents_its_exit_codes(command: str) -> None:
    helped = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert helped.exit_code == 0
    text = " ".join(helped.output.split())
    assert "Exit codes: 0 finished and valid; 3 finished but invalid" in text and "130 / 143" in text
