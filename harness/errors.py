"""One exception for bad input, so the CLI can print one line and exit 2 instead of a traceback."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import pydantic
from pydantic_core import PydanticCustomError

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)

# Exit codes a script can trust; `harness --help` and the README list them.
EXIT_OK = 0  # finished, and the run (every point) is valid
EXIT_ENGINE_DID_NOT_START = 1  # `harness run -- <engine>`: the record keeps the engine's log and says why
EXIT_BAD_INPUT = 2  # could not start: bad input, or a server that is not there or not vLLM
EXIT_INVALID = 3  # finished, but the summary is invalid (its reasons say why) or a point failed
EXIT_SIGINT = 130  # stopped by SIGINT (Ctrl-C); what had finished is on disk
EXIT_SIGTERM = 143  # stopped by SIGTERM
EXIT_CODES_HELP = (
    "Exit codes: 0 finished and valid; 3 finished but invalid (reasons in the summary) or a point failed; "
    "2 bad input or could not start; 1 the engine did not start (its log is in the record); "
    "130 / 143 stopped by SIGINT / SIGTERM."
)


def exit_code_for_signal(name: str | None) -> int | None:
    """128 + the signal's number, as a shell reports a process stopped by it."""
    return {"SIGINT": EXIT_SIGINT, "SIGTERM": EXIT_SIGTERM}.get(name or "")


class HarnessError(Exception):
    """Bad input or an unusable environment; the message names the file, field or value."""


def describe_validation_error(error: pydantic.ValidationError, source: str | Path) -> str:
    """The first failing field of a pydantic model, in one line that names its file."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(root)"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{source}: field '{field}': {first['msg']}{more}"


class FieldError(HarnessError):
    """Bad input in one field of an options model, found once the model exists (its value against the server
    or the inventory): the library names the field, a command line the flag that set it."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


FIELDS_RULE = "fields_rule"  # the pydantic error type of a rule across fields


def fields_rule(template: str, **fields: str) -> PydanticCustomError:
    """A rule across fields for a model validator to raise: `template` names them as `{placeholders}`, so the
    library's message names the fields and a command line's the flags that set them."""
    return PydanticCustomError(FIELDS_RULE, template, {"rule": template, **fields})


def flag_of(field: str, flags: Mapping[str, str] | None = None) -> str:
    """The flag that sets `field`: the one `flags` maps it to, else the field's own name as a flag."""
    return (flags or {}).get(field) or "--" + field.replace("_", "-")


def describe_option_error(error: pydantic.ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """The first refused field of a command's options model as the flag the user typed, in one line:
    '--block-size: vLLM's block sizes are 1, 8, ..., not 17'. `flags` maps fields whose flag differs."""
    first = error.errors()[0]
    if not first["loc"]:  # a rule across fields: its own words, the flags in place of the fields
        if first["type"] != FIELDS_RULE:
            return describe_validation_error(error, "command line")
        context = first.get("ctx") or {}
        message = str(context["rule"])
        for placeholder, field in context.items():
            message = message.replace(f"{{{placeholder}}}", flag_of(str(field), flags))
        return message
    option = flag_of(str(first["loc"][-1]), flags)
    given = repr(first["input"]) if isinstance(first["input"], str) else first["input"]
    return f"{option}: {first['msg'].removeprefix('Value error, ')}, not {given}"


def validate_options(model: type[ModelT], values: dict[str, object]) -> ModelT:
    """A command's options model from its option values; a refused value is one line naming its option."""
    try:
        return model.model_validate(values)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_option_error(error)) from None
