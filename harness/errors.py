"""One exception for bad input, so the CLI can print one line and exit 2 instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pydantic


class HarnessError(Exception):
    """Bad input or an unusable environment; the message names the file, field or value."""


def describe_validation_error(error: pydantic.ValidationError, source: str | Path) -> str:
    """The first failing field of a pydantic model, in one line that names its file."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(root)"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{source}: field '{field}': {first['msg']}{more}"
