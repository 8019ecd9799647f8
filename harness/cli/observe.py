"""`harness capacity`: what an engine logged about its KV cache, beside /metrics and the calculator."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import app, one_line_errors


@app.command()
@one_line_errors
def capacity(
    log: str | None = typer.Option(None, "--log", help="engine start-up log file, or - for stdin"),
    run: Path | None = typer.Option(None, "--run", help="local run directory holding the captured engine.log"),
    polyaxon_run: str | None = typer.Option(None, "--polyaxon-run", help="Polyaxon run UUID whose logs to read"),
    project: str | None = typer.Option(None, "--project", help="project of the Polyaxon run: OWNER/NAME, or NAME "
                                       "for default/NAME"),
    metrics: str | None = typer.Option(None, "--metrics", help="/metrics URL (or a saved scrape) to cross-check"),
    model: str | None = typer.Option(None, help="model for the prediction (default: the one the log names)"),
    revision: str | None = typer.Option(None, help="hub revision of --model"),
    gpu: str | None = typer.Option(None, help="GPU name or total GiB, for the waterfall when the log lacks it"),
    engine_version: str | None = typer.Option(None, help="vLLM version, when the log does not state it"),
    tensor_parallel_size: int | None = typer.Option(None, help="tensor-parallel size, when the log does not state it"),
    pipeline_parallel_size: int | None = typer.Option(None, help="pipeline stages, when the log does not state "
                                                      "them"),
    kv_cache_dtype: str | None = typer.Option(None, help="KV cache dtype, when the log does not state it"),
    quantization: str | None = typer.Option(None, help="the weights' quantization (vLLM's --quantization), when "
                                            "the log does not state it"),
    start: int | None = typer.Option(None, help="which start of a log holding several, counted from 1 "
                                     "(default: the last)"),
    json_output: bool = typer.Option(False, "--json", help="print the versioned JSON report"),
) -> None:
    """The KV capacity the engine logged, /metrics beside it, and the calculator's prediction; exit 1 if none."""
    from rich.console import Console

    from harness.observe.capacity import capacity_from_sources
    from harness.observe.capacity_options import LogOverrides
    from harness.observe.capacity_table import capacity_renderable

    stated = LogOverrides.from_command_line(engine_version=engine_version, tensor_parallel_size=tensor_parallel_size,
                                            pipeline_parallel_size=pipeline_parallel_size,
                                            kv_cache_dtype=kv_cache_dtype, quantization=quantization)

    report = capacity_from_sources(
        log=log, run_dir=run, polyaxon_run=polyaxon_run, project=project, metrics=metrics, model=model,
        revision=revision, gpu=gpu, stated=stated, start=start,
    )
    if json_output:
        print(report.model_dump_json(indent=2))
    else:
        Console().print(capacity_renderable(report))
    if report.log is not None and not report.log.capacity_found:
        raise typer.Exit(1)
