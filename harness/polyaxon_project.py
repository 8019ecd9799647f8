"""Naming a Polyaxon project (or queue) the way every command does: one parser, one rule for a bare name.

A bare NAME is `default/NAME`. That is the owner Polyaxon's own client picks when no user or organization
is configured (`polyaxon._env_vars.getters.project._get_project_context` falls back to `DEFAULT`, "default",
on Community Edition), and Community Edition's only owner. The harness does not read the CLI's cached user
config for it, so one `--project` value names one project on every machine and in every command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.errors import HarnessError

DEFAULT_OWNER = "default"
SLUG = re.compile(r"[A-Za-z0-9_-]+")  # what Polyaxon accepts for an owner's, a project's or a queue's name


@dataclass(frozen=True)
class ProjectName:
    """A Polyaxon project as its API addresses it."""

    owner: str
    name: str

    def __str__(self) -> str:
        return f"{self.owner}/{self.name}"


def parse_project(project: str, option: str = "--project") -> ProjectName:
    """OWNER/NAME, or NAME alone for `default/NAME`, each a slug. Checked before anything starts: Polyaxon's
    client refuses a bad one later, with a traceback."""
    owner, name = _slug_pair(project, option, ("OWNER", "NAME"))
    return ProjectName(owner=owner or DEFAULT_OWNER, name=name)


def check_queue(queue: str, option: str = "--queue") -> str:
    """`queue` when Polyaxon can route to it: AGENT/QUEUE, or QUEUE alone (Polyaxon picks the agent)."""
    _slug_pair(queue, option, ("AGENT", "QUEUE"))
    return queue


def _slug_pair(text: str, option: str, parts: tuple[str, str]) -> tuple[str, str]:
    """'A/B' → ('A', 'B'), 'B' → ('', 'B'); anything else is refused in one line naming `option`."""
    first, slash, second = text.rpartition("/")
    if not all(SLUG.fullmatch(part) for part in ([first] if slash else []) + [second]):
        raise HarnessError(f"{option} {text!r}: must be {'/'.join(parts)} or {parts[1]}, "
                           "each of letters, digits, '_' and '-'")
    return first, second
