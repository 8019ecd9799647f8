"""One `--project` value names one Polyaxon project: a bare NAME is default/NAME in every command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import HarnessError
from harness.polyaxon_project import ProjectName, check_queue, parse_project

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = str(ROOT / "prompts" / "tiny-qwen3-600x8")
SWEEP = str(ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml")
RUN_UUID = "0123456789abcdef0123456789abcdef"
COMMANDS = {  # each command with --project serving, up to where it first addresses the project
    "run": ["run", "--inventory", INVENTORY, "--out", "{tmp}/run", "--base-url", "http://127.0.0.1:9",
            "--concurrency", "2", "--ready-timeout-s", "2", "--project", "serving"],
    "sweep": ["sweep", "-f", SWEEP, "-P", "concurrency=2", "--out", "{tmp}/sweep", "--project", "serving"],
    "report": ["report", "--limit", "max_num_seqs", "--out", "{tmp}/report", "--project", "serving"],
    "capacity": ["capacity", "--polyaxon-run", RUN_UUID, "--project", "serving"],
}


def test_a_bare_name_is_the_default_owners_project() -> None:
    assert parse_project("serving") == ProjectName(owner="default", name="serving")
    assert parse_project("acme/serving") == ProjectName(owner="acme", name="serving")
    assert str(parse_project("serving")) == "default/serving"


@pytest.mark.parametrize("project", ["", "/serving", "acme/", "a/b/c", "a b", "serving\n", "a.b"])
def test_a_name_polyaxon_cannot_address_is_refused(project: str) -> None:
    with pytest.raises(HarnessError, match=r"^--project .*: must be OWNER/NAME or NAME"):
        parse_project(project)


def test_a_queue_is_checked_by_the_same_rule() -> None:
    assert check_queue("agent/gpu") == "agent/gpu" and check_queue("gpu") == "gpu"
    with pytest.raises(HarnessError, match=r"^--queue 'a/b/c': must be AGENT/QUEUE or QUEUE"):
        check_queue("a/b/c")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_resolves_a_bare_project_name_alike(command: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command stops where it first names the project to Polyaxon; all name the same one."""
    import polyaxon.client

    from harness.track import tracking

    named: list[str] = []

    def addressed(owner: str | None = None, project: str | None = None, **_: Any) -> None:
        named.append(f"{owner}/{project}")
        raise HarnessError("stop: the project was addressed")

    monkeypatch.setattr(polyaxon.client, "RunClient", addressed)
    monkeypatch.setattr(tracking, "_init", lambda project, *_: addressed(project.owner, project.name))
    monkeypatch.delenv("HARNESS_OFFLINE_ROOT", raising=False)
    result = CliRunner().invoke(app, [word.format(tmp=tmp_path) for word in COMMANDS[command]])
    assert "stop: the project was addressed" in result.output, result.output
    assert named == ["default/serving"]
