"""The options `harness sweep` and `harness search` share to say where a service and its harness jobs run:
declared here once, each a fresh typer option per command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def project_option() -> Any:
    return typer.Option(None, help="Polyaxon project OWNER/NAME, or NAME for default/NAME (required unless --local)")


def local_option() -> Any:
    return typer.Option(False, help="run the services on the local CPU engine and track offline")


def harness_files_option() -> Any:
    return typer.Option([Path("polyaxonfiles/harness-job.yaml")], "--harness", help="harness job polyaxonfile")


def queue_option() -> Any:
    return typer.Option(None, help="Polyaxon queue for the service runs")


def running_deadline_option() -> Any:
    return typer.Option(1800.0, help="seconds a service may take to be running")


def harness_deadline_option() -> Any:
    return typer.Option(7200.0, help="seconds a harness job may take")
