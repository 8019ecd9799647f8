"""`harness budget`: before launch, what a population needs and what a GPU or KV budget holds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from harness.cli.app import app, one_line_errors
from harness.errors import validate_options
from harness.paths import input_directory

if TYPE_CHECKING:
    from harness.predict.budget_plan import BudgetOptions


@app.command()
@one_line_errors
def budget(
    model: str = typer.Option("Qwen/Qwen3-4B", help="config.json, model directory, bundled snapshot or hub id"),
    revision: str | None = typer.Option(None, help="hub revision (bundled snapshots default to the pinned one)"),
    tokens: int | None = typer.Option(None, help="tokens per sequence, prompt + generated"),
    sequences: int = typer.Option(1, help="live sequences of --tokens each"),
    lengths: str | None = typer.Option(None, help="comma-separated per-sequence lengths instead of --tokens"),
    kv_cache_dtype: str = typer.Option("auto", help="auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, ..."),
    tensor_parallel_size: int = typer.Option(1, help="GPUs each layer is split over"),
    decode_context_parallel_size: int = typer.Option(1, help="vLLM's --decode-context-parallel-size: tensor-parallel "
                                                     "ranks each sequence's cache is spread over (MLA)"),
    pipeline_parallel_size: int = typer.Option(1, help="pipeline stages, each holding its share of the layers "
                                               "on its own GPUs"),
    block_size: int = typer.Option(16, help="tokens per KV block (vLLM: 16 on CUDA, 128 on CPU)"),
    shared_prefix_tokens: int = typer.Option(0, help="leading tokens every sequence shares (prefix caching)"),
    hybrid_kv_manager: bool = typer.Option(True, help="vLLM's hybrid KV manager (sliding windows free blocks)"),
    available_kv_gib: float | None = typer.Option(None, help="KV memory per GPU as vLLM logs it, GiB"),
    kv_cache_memory_bytes: int | None = typer.Option(None, help="vLLM's --kv-cache-memory-bytes reservation"),
    gpu_memory_gib: float | None = typer.Option(None, help="total GPU memory, GiB (with utilisation and overhead)"),
    gpu_memory_utilization: float | None = typer.Option(
        None, help="vLLM's --gpu-memory-utilization; unset, the release's default (0.9, from 0.20 0.92)"),
    overhead_gib: float = typer.Option(0.0, help="non-KV memory besides weights (activations, non-torch), GiB"),
    max_model_len: int | None = typer.Option(None, help="request length for maximum concurrency"),
    max_num_batched_tokens: int | None = typer.Option(None, help="vLLM's --max-num-batched-tokens"),
    engine_version: str | None = typer.Option(None, help="vLLM version whose rules to follow (default 0.11.2)"),
    engine: str | None = typer.Option(None, help="the engine as launched, V0 or V1 (VLLM_USE_V1=0 or 1: 0.8 to 0.10 "
                                      "run either); unset, the release's default"),
    gpu: str | None = typer.Option(None, help="before launch: a GPU name (H100-80GB, L40S, ...) or its total GiB"),
    max_num_seqs: int | None = typer.Option(None, help="vLLM's --max-num-seqs (with --gpu)"),
    quantization: str | None = typer.Option(None, help="checkpoint format with --gpu (fp8, awq, gptq, mxfp4, "
                                            "modelopt_fp4, ...); a quantized checkpoint's config.json states its own"),
    speculative_method: str | None = typer.Option(None, help="the drafter of vLLM's --speculative-config: mtp, "
                                                  "eagle, eagle3, ngram, suffix or medusa (its cache joins the KV)"),
    num_speculative_tokens: int | None = typer.Option(None, help="speculative tokens per step, 1 to 64 "
                                                      "(with --speculative-method)"),
    enable_prefix_caching: bool = typer.Option(False, help="vLLM's --enable-prefix-caching as launched: a hybrid "
                                               "keeps a second state block per request"),
    skip_mm_profiling: bool = typer.Option(False, help="vLLM's --skip-mm-profiling as launched: a "
                                           "vision-language model's encoder is not profiled (with --gpu)"),
    language_model_only: bool = typer.Option(False, help="vLLM's --language-model-only as launched: a Qwen "
                                             "vision-language model builds no vision tower and profiles no encoder "
                                             "(with --gpu)"),
    limit_mm_per_prompt: str | None = typer.Option(None, help="vLLM's --limit-mm-per-prompt as launched, "
                                                   "'{\"image\": 1, \"video\": 0}': the images and videos the "
                                                   "encoder's profile carries (with --gpu)"),
    sampler: str | None = typer.Option(None, help="V1's top-k/top-p sampler as the install runs it, with --gpu: "
                                       "flashinfer (vLLM's image before 0.11.1) or pytorch (pip's); unset, "
                                       "PyTorch's before 0.11.1 and the release's own choice after"),
    enforce_eager: bool = typer.Option(False, help="vLLM's --enforce-eager as launched: no CUDA graphs are captured "
                                       "or reserved (with --gpu)"),
    field_check: Path | None = typer.Option(None, help="score the calculator on a field corpus directory"),
    inventory: Path | None = typer.Option(None, help="price an inventory: the live population of --concurrency "
                                          "of its requests against the KV blocks"),
    concurrency: int | None = typer.Option(None, help="requests in flight (with --inventory)"),
    num_gpu_blocks: int | None = typer.Option(None, help="KV blocks as vLLM logged them (with --inventory)"),
    kv_cache_tokens: int | None = typer.Option(None, help="'GPU KV cache size: N tokens' as vLLM logged it "
                                               "(with --inventory)"),
    json_output: bool = typer.Option(False, "--json", help="print the versioned JSON result"),
) -> None:
    """Predict KV bytes for a live-token population, the weights, and what vLLM makes of a KV budget."""
    from rich.console import Console

    from harness.predict.budget_plan import BudgetOptions, plan_budget
    from harness.predict.budget_table import budget_renderable
    from harness.predict.model_shape import load_model_shape
    from harness.predict.speculative import speculative_from_options

    options = validate_options(BudgetOptions, dict(
        tokens=tokens, sequences=sequences, lengths=lengths, kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
        decode_context_parallel_size=decode_context_parallel_size, block_size=block_size,
        shared_prefix_tokens=shared_prefix_tokens,
        hybrid_kv_manager=hybrid_kv_manager, available_kv_gib=available_kv_gib,
        kv_cache_memory_bytes=kv_cache_memory_bytes, gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=gpu_memory_utilization, overhead_gib=overhead_gib, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens, engine_version=engine_version, engine=engine,
        max_num_seqs=max_num_seqs,
        quantization=quantization, concurrency=concurrency, num_gpu_blocks=num_gpu_blocks,
        kv_cache_tokens=kv_cache_tokens, enable_prefix_caching=enable_prefix_caching,
        skip_mm_profiling=skip_mm_profiling, language_model_only=language_model_only,
        limit_mm_per_prompt=limit_mm_per_prompt, sampler=sampler,
        enforce_eager=enforce_eager,
        speculative=speculative_from_options(speculative_method, num_speculative_tokens),
    ))
    if inventory is not None:
        _price_inventory(inventory, options, model, revision, json_output)
        return
    if field_check is not None:
        from harness.calibrate.field_check import run_field_check
        from harness.calibrate.field_report import field_renderable
        from harness.cli.app import report_console

        report = run_field_check(input_directory(field_check, "--field-check"))
        print(report.model_dump_json(indent=2)) if json_output else report_console(pipe_width=240).print(
            field_renderable(report))
        return
    if gpu is not None:
        from harness.errors import HarnessError
        from harness.predict.fit_answer import answer_fit, answer_renderable
        from harness.predict.releases import engine_version_warnings

        unread = options.unread_before_launch()
        if unread:
            raise HarnessError(f"{', '.join(unread)}: not read with --gpu, whose answer takes the KV memory from "
                               "its own waterfall for requests of --tokens (or max_model_len); leave them out")
        for warning in engine_version_warnings(options.engine_version):
            print(f"warning: {warning}", file=sys.stderr)
        shape = load_model_shape(model, revision)
        answer = answer_fit(shape, options.engine_launch(shape), gpu=gpu, asked_tokens=options.tokens,
                            kv_cache_dtype=options.kv_cache_dtype, block_size=options.block_size,
                            prefix_caching=options.enable_prefix_caching,
                            decode_context_parallel_size=options.decode_context_parallel_size)
        print(answer.model_dump_json(indent=2)) if json_output else Console().print(answer_renderable(answer))
        return
    result = plan_budget(load_model_shape(model, revision), options)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if json_output:
        print(result.model_dump_json(indent=2))
    else:
        Console().print(budget_renderable(result))


def _price_inventory(directory: Path, options: BudgetOptions, model: str, revision: str | None, as_json: bool) -> None:
    """The inventory's requests (prompt + output cap each) priced against the engine's KV blocks; a
    conversation's turns are kept together, as the client sends them."""
    from rich.console import Console

    from harness.inventory.frozen import load_inventory, resolve_inventory
    from harness.inventory.output_cap import request_tokens
    from harness.predict.budget_inventory import kv_blocks, population_table, price_inventory
    from harness.predict.model_shape import load_model_shape

    loaded = load_inventory(input_directory(resolve_inventory(directory), "--inventory"))
    warnings: list[str] = []
    given = options.num_gpu_blocks is not None or options.kv_cache_tokens is not None
    kv = kv_blocks(options, None if given else load_model_shape(model, revision), warnings)
    priced = price_inventory(loaded.manifest.name, loaded.digest, request_tokens(loaded, None), options, kv,
                             [p.conversation_id for p in loaded.prompts])
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(priced.model_dump_json(indent=2)) if as_json else Console().print(population_table(priced))
