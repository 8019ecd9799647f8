"""The `harness` command: thin wrappers, each a call into a module that tests can call directly."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from harness.errors import HarnessError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input ends with one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except HarnessError as error:
            print(f"error: {error}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper


@app.command()
@one_line_errors
def budget(
    model: str = typer.Option("Qwen/Qwen3-4B", help="config.json, model directory, bundled snapshot or hub id"),
    revision: str | None = typer.Option(None, help="hub revision (bundled snapshots default to the pinned one)"),
    tokens: int | None = typer.Option(None, help="tokens per sequence, prompt + generated"),
    sequences: int = typer.Option(1, help="live sequences of --tokens each"),
    lengths: str | None = typer.Option(None, help="comma-separated per-sequence lengths instead of --tokens"),
    kv_cache_dtype: str = typer.Option("auto", help="auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, ..."),
    tensor_parallel_size: int = typer.Option(1, help="GPUs the model is split over"),
    block_size: int = typer.Option(16, help="tokens per KV block (vLLM: 16 on CUDA, 128 on CPU)"),
    shared_prefix_tokens: int = typer.Option(0, help="leading tokens every sequence shares (prefix caching)"),
    hybrid_kv_manager: bool = typer.Option(True, help="vLLM's hybrid KV manager (sliding windows free blocks)"),
    available_kv_gib: float | None = typer.Option(None, help="KV memory per GPU as vLLM logs it, GiB"),
    kv_cache_memory_bytes: int | None = typer.Option(None, help="vLLM's --kv-cache-memory-bytes reservation"),
    gpu_memory_gib: float | None = typer.Option(None, help="total GPU memory, GiB (with utilisation and overhead)"),
    gpu_memory_utilization: float = typer.Option(0.9, help="vLLM's --gpu-memory-utilization"),
    overhead_gib: float = typer.Option(0.0, help="non-KV memory besides weights (activations, non-torch), GiB"),
    max_model_len: int | None = typer.Option(None, help="request length for maximum concurrency"),
    max_num_batched_tokens: int | None = typer.Option(None, help="vLLM's --max-num-batched-tokens"),
    engine_version: str | None = typer.Option(None, help="vLLM version whose rules to follow (default 0.11.2)"),
    json_output: bool = typer.Option(False, "--json", help="print the versioned JSON result"),
) -> None:
    """Predict KV bytes for a live-token population, the weights, and what vLLM makes of a KV budget."""
    options = {name: value for name, value in locals().items() if name not in ("model", "revision", "json_output")}
    from rich.console import Console

    from harness.budget import plan_budget
    from harness.budget_table import budget_renderable
    from harness.model_shape import load_model_shape

    result = plan_budget(load_model_shape(model, revision), **options)
    if json_output:
        print(result.model_dump_json(indent=2))
    else:
        Console().print(budget_renderable(result))
