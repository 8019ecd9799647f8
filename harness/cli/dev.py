"""`harness emulate`, `harness model tiny` and `harness demo`: the aids for trying the loop on a laptop."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import app, one_line_errors
from harness.errors import EXIT_CODES_HELP, EXIT_INVALID, validate_options


@app.command()
@one_line_errors
def emulate(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, help="port to listen on"),
    model: str = typer.Option("emulated", help="model name served"),
    ttft_ms: float = typer.Option(20.0, help="time to first token after admission, ms"),
    itl_ms: float = typer.Option(5.0, help="time between tokens, ms"),
    tokens_per_chunk: int = typer.Option(1, help="tokens carried by each streamed chunk after the first"),
    max_num_seqs: int = typer.Option(256, help="sequences running at once; the rest wait"),
    kv_capacity_tokens: int = typer.Option(1_048_576, help="live prompt+output tokens admitted at once"),
    max_model_len: int = typer.Option(4096, help="prompt+max_tokens above this is rejected with HTTP 400"),
    drop_every: int | None = typer.Option(None, help="abort every Nth stream's connection after 2 chunks"),
) -> None:
    """Serve a vLLM-shaped API with scripted timing, for dry runs and client benchmarks. With VLLM_API_KEY set,
    /v1/* answer only requests bearing that key, as vLLM's API server does."""
    import os

    from harness.dev.emulator import EmulatorConfig, serve
    from harness.server_auth import API_KEY_ENV

    serve(
        validate_options(EmulatorConfig, dict(
            host=host,
            port=port,
            model=model,
            ttft_ms=ttft_ms,
            itl_ms=itl_ms,
            tokens_per_chunk=tokens_per_chunk,
            max_num_seqs=max_num_seqs,
            kv_capacity_tokens=kv_capacity_tokens,
            max_model_len=max_model_len,
            drop_every=drop_every,
            api_key=os.environ.get(API_KEY_ENV) or None,
        ))
    )


model_app = typer.Typer(no_args_is_help=True, help="The generated tiny model the CPU engine serves.")
app.add_typer(model_app, name="model")


@model_app.command("tiny")
@one_line_errors
def model_tiny(seed: int = typer.Option(0, min=0, max=2**63 - 1,
                                        help="weights seed; the same seed gives byte-identical files")) -> None:
    """Generate the tiny Qwen3 model once (cached) and print its directory."""
    from harness.dev.tiny_model import ensure_tiny_model

    print(ensure_tiny_model(seed))


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def demo(
    out: Path | None = typer.Option(None, help="directory for the demo's runs and report (default: runs/demo-TIME)"),
    repeats: int = typer.Option(1, help="runs per point, each with its own engine: the report shows the spread"),
) -> None:
    """The whole loop on this machine: predict, launch the real CPU engine, measure a sweep, analyse it."""
    import time

    from harness.cli.app import report_console
    from harness.dev.demo import run_demo
    from harness.launch.engine_process import stop_on_sigterm

    console = report_console()
    with stop_on_sigterm():
        result = run_demo(out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"), console, repeats)
    failed = f"; points that failed: {result.failed_points}" if result.failed_points else ""
    invalid = f"; invalid points: {result.invalid_points}" if result.invalid_points else ""
    print(f"demo finished in {result.seconds:.0f} s{failed}{invalid}")
    if result.failed_points or result.invalid_points:
        raise typer.Exit(EXIT_INVALID)
