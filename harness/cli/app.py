"""The `harness` application and the guard every command wears: bad input is one line and exit code 2."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from harness.errors import (
    EXIT_BAD_INPUT,
    EXIT_SIGINT,
    HarnessError,
)

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input ends with one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except HarnessError as error:
            print(f"error: {error}", file=sys.stderr)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:  # whatever had finished is already on disk
            print("interrupted", file=sys.stderr)
            raise typer.Exit(EXIT_SIGINT) from None

    return wrapper
