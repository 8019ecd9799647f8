"""The `harness` command: thin wrappers, each a call into a module that tests can call directly."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from harness.errors import HarnessError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input ends with one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except HarnessError as error:
            print(f"error: {error}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper
