"""Calling Polyaxon's client so that a failure is one line, not a logged stack trace and a raw exception.

The client logs a multi-line report before it raises, and raises many unrelated types (HTTP errors,
connection errors, validation errors) that all mean the same to us: the call did not happen.

One answer is not final: Polyaxon's API (the sandbox, at least) refuses calls with HTTP 405 while it is busy
compiling or stopping runs it was just sent, and takes the same call a moment later (creating a run, stopping
one, renaming and tagging one were each seen refused). Every call asks again for a few seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from harness.errors import HarnessError
from harness.schema import TrackedRun

# Without it Polyaxon sets up Sentry to send its errors away. Its settings read the environment once, when
# polyaxon is first imported: so every module of ours that loads polyaxon imports this one first (importing
# it is enough), and a process started for Polyaxon (the test sandbox) gets QUIET_POLYAXON_ENV.
QUIET_POLYAXON_ENV = {"POLYAXON_DISABLE_ERRORS_REPORTING": "true"}


def quiet_polyaxon() -> None:
    """Switch Polyaxon's error reporting off in this process, unless the environment already says."""
    for name, value in QUIET_POLYAXON_ENV.items():
        os.environ.setdefault(name, value)


quiet_polyaxon()

T = TypeVar("T")

BUSY_STATUS = 405
BUSY_RETRY_INTERVAL_S = 1.0
BUSY_RETRY_S = 10.0  # how long a call keeps asking while the API answers 405


def polyaxon_call(failure: str, call: Callable[[], T]) -> T:
    """`call()`, or a HarnessError '<failure>: <ErrorType> <first line>' with the client kept quiet.
    An HTTP 405 is asked again every second until BUSY_RETRY_S have passed."""
    deadline = time.monotonic() + BUSY_RETRY_S
    logging.disable(logging.CRITICAL)
    try:
        while True:
            try:
                return call()
            except Exception as error:  # every client failure means the call did not happen
                if getattr(error, "status", None) == BUSY_STATUS and time.monotonic() < deadline:
                    time.sleep(BUSY_RETRY_INTERVAL_S)
                    continue
                reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
                raise HarnessError(f"{failure}: {type(error).__name__} {reason}".rstrip()) from None
    finally:
        logging.disable(logging.NOTSET)


def managed_run() -> TrackedRun | None:
    """Inside a Polyaxon-managed run, who it is: POLYAXON_RUN_INSTANCE is owner.project.runs.uuid."""
    parts = os.environ.get("POLYAXON_RUN_INSTANCE", "").split(".")
    if len(parts) != 4:
        return None
    return TrackedRun(run_uuid=parts[3], owner=parts[0], project=parts[1], offline_root=None)


def managed_run_uuid() -> str | None:
    managed = managed_run()
    return managed.run_uuid if managed else None
