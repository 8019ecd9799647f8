"""`harness report`: join runs by UUID, compare one limit, diagnose, write the report."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import app, one_line_errors
from harness.errors import HarnessError


@app.command()
@one_line_errors
def report(
    runs: list[Path] = typer.Option([], "--runs", help="directory of run records, searched recursively (repeatable)"),
    offline_root: Path | None = typer.Option(None, help="Polyaxon offline root (holds runs/<uuid>/run.plx.json)"),
    project: str | None = typer.Option(None, help="Polyaxon project to read runs from: OWNER/NAME, or NAME "
                                       "for default/NAME"),
    query: str | None = typer.Option(None, help="Polyaxon query to select the project's runs"),
    api_limit: int = typer.Option(100, help="most runs to read from the Polyaxon API"),
    limit: str = typer.Option(..., "--limit", help="the one input the runs differ in, e.g. max_num_seqs"),
    out: Path = typer.Option(..., help="directory for report.md, report.html and the plots"),
) -> None:
    """Compare runs along one limit, say which limit bound each run, and write Markdown and HTML."""
    from analysis.report import write_report
    from harness.polyaxon_project import parse_project

    if api_limit < 1:
        raise HarnessError(f"--api-limit: {api_limit} is not a positive number of runs")
    if project is not None:
        parse_project(project)
    if query is not None and not query.strip():
        raise HarnessError("--query: empty; leave it out to read every run of --project")
    written = write_report(limit=limit, out=out, run_dirs=runs, offline_root=offline_root, project=project,
                           query=query, api_limit=api_limit)
    for verdict in written.verdicts:
        print(f"{verdict.run_uuid}: {verdict.bound_by}")
    print(f"report: {written.markdown} and {written.html}")
    from harness.polyaxon_client import managed_run
    from harness.track.tracking import track_report

    if managed_run():  # the report operation: the HTML becomes the run's artifact in the dashboard
        track_report(written.markdown, written.html, len(written.runs))
