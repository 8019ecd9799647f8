"""Calling Polyaxon's client so that a failure is one line, not a logged stack trace and a raw exception.

The client logs a multi-line report before it raises, and raises many unrelated types (HTTP errors,
connection errors, validation errors) that all mean the same to us: the call did not happen.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

from harness.errors import HarnessError

os.environ.setdefault("POLYAXON_DISABLE_ERRORS_REPORTING", "true")

T = TypeVar("T")


def polyaxon_call(failure: str, call: Callable[[], T]) -> T:
    """`call()`, or a HarnessError '<failure>: <ErrorType> <first line>' with the client kept quiet."""
    logging.disable(logging.CRITICAL)
    try:
        return call()
    except Exception as error:  # every client failure means the call did not happen
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        raise HarnessError(f"{failure}: {type(error).__name__} {reason}".rstrip()) from None
    finally:
        logging.disable(logging.NOTSET)
