"""The `harness` application and the guard every command wears: bad input is one line and exit code 2.

Three layers give that answer whatever the input: `HarnessGroup` turns typer's usage errors (a value that is
not an integer, an unknown or missing option) into one line instead of a usage panel; `guard_parameter`,
applied to every parameter of every command, refuses NaN, ±infinity and empty paths before a command runs;
`one_line_errors` prints a `HarnessError` (and an OSError that names its file) raised while it runs.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import pydantic
import typer
from typer._click.core import Command, Parameter
from typer._click.exceptions import BadParameter, MissingParameter, NoArgsIsHelpError, UsageError
from typer.core import TyperArgument, TyperGroup, TyperOption

from harness.errors import (
    EXIT_BAD_INPUT,
    EXIT_SIGINT,
    HarnessError,
)
from harness.redact import redact_text

if TYPE_CHECKING:
    from rich.console import Console

# pydantic's error types for a value typer could not parse, as the kind of value the option wants
PARSE_ERRORS = {"int_parsing": "an integer", "int_from_float": "an integer", "int_type": "an integer",
                "float_parsing": "a number", "float_type": "a number", "bool_parsing": "true or false"}


def option_name(param: Parameter) -> str:
    """How the user named the parameter: its long option ('--max-num-seqs'), or an argument's metavar."""
    long = [opt for opt in param.opts if opt.startswith("--")]
    if param.param_type_name == "option" and (long or param.opts):
        return max(long or param.opts, key=len)
    return (param.metavar or param.name or "argument").upper()


def usage_line(error: UsageError) -> str:
    """A usage error in one line that names the option and the value: '--tokens: '1.5' is not an integer'."""
    param = getattr(error, "param", None)
    if isinstance(error, BadParameter) and not isinstance(error, MissingParameter) and param is not None:
        name, cause = option_name(param), error.__cause__
        if isinstance(cause, pydantic.ValidationError) and cause.errors():
            first = cause.errors()[0]
            if first["type"] in PARSE_ERRORS:
                return f"{name}: {first['input']!r} is not {PARSE_ERRORS[first['type']]}"
            return f"{name}: {first['msg']}, not {first['input']}"
        return f"{name}: {' '.join(error.message.split())}"
    return " ".join(error.format_message().split())


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """Typer's usage panel (usage, hint, boxed message) becomes one line on stderr and exit code 2."""
    try:
        yield
    except NoArgsIsHelpError:  # `harness prompts` alone: the help is the answer
        raise
    except UsageError as error:
        print(f"error: {redact_text(usage_line(error))}", file=sys.stderr)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def guard_parameter(param: TyperOption | TyperArgument) -> None:
    """Refuse, as a usage error naming the option, what typer would pass on: NaN or ±infinity for a number, and
    '' for a path (which would silently mean the current directory)."""
    process = param.process_value

    def checked(ctx: Any, value: Any) -> Any:
        result = process(ctx, value)
        for given, converted in zip(_items(value), _items(result), strict=False):
            if isinstance(converted, float) and not math.isfinite(converted):
                raise BadParameter(f"must be a finite number, not {given}", ctx=ctx, param=param)
            if isinstance(converted, PurePath) and isinstance(given, str) and not given.strip():
                raise BadParameter("empty; give a path", ctx=ctx, param=param)
        return result

    param.process_value = checked  # type: ignore[method-assign]


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def commands_of(command: Command) -> Iterator[Command]:
    """`command` and, for a group, every command below it."""
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from commands_of(sub)


class HarnessGroup(TyperGroup):
    """The `harness` group: every parameter below it guarded, every usage error one line."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in commands_of(self):
            for param in command.params:
                if isinstance(param, TyperOption | TyperArgument):
                    guard_parameter(param)

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        with one_line_usage_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with one_line_usage_errors():  # the sub-command's own parsing happens in here
            return super().invoke(ctx)


app = typer.Typer(cls=HarnessGroup, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def one_line(message: str) -> str:
    """A message that spans lines (a library's, quoted) still ends as one."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input ends with one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except HarnessError as error:
            print(f"error: {one_line(redact_text(str(error)))}", file=sys.stderr)  # it may quote a URL or a log line
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except OSError as error:  # a path the command's own checks let through: name it; anything else is a bug
            if error.filename is None:
                raise
            print(f"error: {one_line(redact_text(f'{error.filename}: {error.strerror or error}'))}", file=sys.stderr)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:  # whatever had finished is already on disk
            print("interrupted", file=sys.stderr)
            raise typer.Exit(EXIT_SIGINT) from None

    return wrapper


def report_console(pipe_width: int = 160) -> Console:
    """A terminal's own width; a pipe or a log file is not 80 columns wide, so tables there get `pipe_width`."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=pipe_width)
