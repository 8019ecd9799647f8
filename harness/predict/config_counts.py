"""Reading one count from a config: every reader takes it the same way and names the field the same way.

A count is a whole number above zero (a bool is not one, though Python counts it an int). A count the config
may leave out reads as None; one the figure cannot be made without is refused, naming what it is needed for.
`where` prefixes the field's section (`vision_config.`) so the message names the field as the file holds it.
"""

from __future__ import annotations

import reprlib
from typing import Any

from harness.errors import HarnessError


def stated_count(section: dict[str, Any], name: str, source: str, where: str = "") -> int | None:
    """The count if the config states it (None, or no such field, is "not stated"), refused if it is not one."""
    value = section.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HarnessError(f"{source}: field '{where}{name}' must be a positive integer, got {reprlib.repr(value)}")
    return value


def needed_count(section: dict[str, Any], name: str, source: str, purpose: str, where: str = "") -> int:
    """A count the figure named by `purpose` ("to size the weights") cannot be made without."""
    value = stated_count(section, name, source, where)
    if value is None:
        raise HarnessError(f"{source}: field '{where}{name}' (a positive integer) is needed {purpose}")
    return value
