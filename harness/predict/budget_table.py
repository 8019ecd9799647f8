"""The budget as a person reads it: exact bytes beside binary units, and every assumption listed."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness.predict.budget import BudgetResult, CapacityPrediction
from harness.units import GiB


def binary_size(num_bytes: float) -> str:
    """147456 → '144 KiB': the largest binary unit that keeps the figure ≥ 1, two decimals at most."""
    for unit, size in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{num_bytes:.0f} B"


def exact(num_bytes: int) -> str:
    return f"{num_bytes:,} B ({binary_size(num_bytes)})"


def budget_renderable(result: BudgetResult) -> Group:
    parts = [_model_table(result), _kinds_table(result), _population_table(result)]
    if result.capacity is not None:
        parts.append(_capacity_table(result.capacity))
    caveat = Text(
        "The subtotal is weights + KV only: it is not evidence that the workload fits a GPU of that size. "
        "vLLM also needs activation, CUDA-graph and context memory, and gives the KV cache only "
        "gpu_memory_utilization × total − everything else.",
        style="yellow",
    )
    assumptions = Table(title="Assumptions", show_header=False, box=None)
    for note in [*result.assumptions, *(result.capacity.assumptions if result.capacity else [])]:
        assumptions.add_row("•", note)
    return Group(*parts, caveat, assumptions)


def _model_table(result: BudgetResult) -> Table:
    table = Table(title="Model", show_header=False)
    table.add_row("model", f"{result.model}" + (f"@{result.revision}" if result.revision else ""))
    table.add_row("read from", result.model_source)
    table.add_row("kv cache dtype", f"{result.kv_cache_dtype} ({result.kv_bytes_per_element} B per element)")
    table.add_row("tensor parallel size", str(result.tensor_parallel_size))
    table.add_row("block size", f"{result.block_size} tokens")
    return table


def _kinds_table(result: BudgetResult) -> Table:
    with_state = any(kind.state_bytes_per_sequence for kind in result.kinds)
    table = Table(title="KV bytes by layer kind (per GPU)")
    columns = ["layer kind", "layers", "kv_bytes_per_token"] + (["state_bytes_per_sequence"] if with_state else [])
    for column in columns:
        table.add_column(column, justify="left" if column == "layer kind" else "right")
    for kind in result.kinds:
        state = [exact(kind.state_bytes_per_sequence)] if with_state else []
        table.add_row(kind.kind.value, str(kind.layers), exact(kind.kv_bytes_per_token), *state)
    if len(result.kinds) > 1:
        state = [exact(sum(k.state_bytes_per_sequence for k in result.kinds))] if with_state else []
        table.add_row("all", str(sum(k.layers for k in result.kinds)), exact(result.kv_bytes_per_token), *state,
                      style="bold")
    return table


def _population_table(result: BudgetResult) -> Table:
    table = Table(title="Live-token population (per GPU)", show_header=False)
    for sequence in result.sequences:
        table.add_row(f"{sequence.count} × {sequence.tokens:,} tokens, per sequence",
                      f"raw {exact(sequence.kv_bytes_raw)}; padded {exact(sequence.kv_bytes_padded)}")
    prefix = f", {result.shared_prefix_tokens:,} of them a shared prefix" if result.shared_prefix_tokens else ""
    table.add_row(f"{result.population_sequences} sequences, {result.population_tokens:,} tokens{prefix}",
                  f"raw {exact(result.population_kv_bytes_raw)}; padded {exact(result.population_kv_bytes_padded)}",
                  style="bold")
    if result.weights_bytes is None or result.weights_plus_kv_bytes is None:
        table.add_row("weights", "unknown")
    else:
        table.add_row("weights", f"{exact(result.weights_bytes)} — {result.weights_source}")
        table.add_row("weights + KV (padded) subtotal", exact(result.weights_plus_kv_bytes), style="bold")
    return table


def _capacity_table(capacity: CapacityPrediction) -> Table:
    table = Table(title=f"What vLLM {capacity.engine_version} makes of the KV budget", show_header=False)
    table.add_row("available KV memory", f"{exact(capacity.available_kv_bytes)} — {capacity.available_kv_source}")
    table.add_row("bytes per block", f"{exact(capacity.bytes_per_block)}, {capacity.kv_cache_groups} group(s)")
    table.add_row("blocks", f"{capacity.num_blocks:,} of {capacity.block_size} tokens")
    table.add_row("KV cache size", f"{capacity.kv_cache_tokens:,} tokens")
    table.add_row(
        "maximum concurrency",
        f"{capacity.max_concurrency:.2f}x for {capacity.max_model_len:,} tokens per request "
        f"({capacity.blocks_per_request:,} blocks each)",
    )
    table.add_row("whole sequences that fit", f"{capacity.whole_sequences_at_max_model_len:,} "
                  f"of {capacity.max_model_len:,} tokens (one block is vLLM's reserved null block)")
    return table
