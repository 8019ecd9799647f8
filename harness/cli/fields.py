"""Command-line options declared by the models' fields, and the models' refusals told as the flags.

An option that fills a model's field is declared once, on the field: its default, its constraints and its help
(the field's description). The command's signature only names the flag; `field_flags` reads back which flag
fills which field, so a library error that names a field (`rate_per_s`) reaches the user as the flag they
typed (`--rate`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pydantic
from typer.models import OptionInfo

from harness.errors import FieldError, HarnessError, describe_option_error, flag_of


class FieldOption(OptionInfo):
    """A typer option whose default and help are those of `model`'s field `field`."""

    def __init__(self, model: type[pydantic.BaseModel], field: str, **extra: Any) -> None:
        declared = model.model_fields[field]
        super().__init__(default=... if declared.is_required() else declared.default, help=declared.description,
                         **extra)
        self.field = field


def field_option(model: type[pydantic.BaseModel], field: str, **extra: Any) -> Any:
    """The option for `model.field`, as a parameter's default (typer reads its options from the defaults)."""
    return FieldOption(model, field, **extra)


def field_flags(command: Callable[..., Any]) -> dict[str, str]:
    """{field: flag} for every parameter of `command` declared by `field_option`: the flag is the parameter's
    name as typer spells it (`max_tokens` → `--max-tokens`)."""
    return {option.field: "--" + name.replace("_", "-")
            for name, parameter in inspect.signature(command).parameters.items()
            if isinstance(option := parameter.default, FieldOption)}


@contextmanager
def refused_as_flags(flags: dict[str, str]) -> Iterator[None]:
    """While the options are built: a refused field as one line that names its flag."""
    try:
        yield
    except pydantic.ValidationError as error:
        raise HarnessError(describe_option_error(error, flags)) from None


def flags_for_fields(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with a field found wrong once its options were built (against the server, the inventory)
    told as the flag that set it."""
    flags = field_flags(command)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except FieldError as error:
            raise HarnessError(f"{flag_of(error.field, flags)}: {error.detail}") from None

    return wrapper
