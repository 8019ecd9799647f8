"""The `harness` command: thin wrappers, each a call into a module that tests can call directly."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from harness.errors import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_ENGINE_DID_NOT_START,
    EXIT_INVALID,
    EXIT_SIGINT,
    HarnessError,
    exit_code_for_signal,
)
from harness.schema import RunFile

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input ends with one line on stderr and exit code 2, never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except HarnessError as error:
            print(f"error: {error}", file=sys.stderr)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:  # whatever had finished is already on disk
            print("interrupted", file=sys.stderr)
            raise typer.Exit(EXIT_SIGINT) from None

    return wrapper


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
    """Serve a vLLM-shaped API with scripted timing, for dry runs and client benchmarks."""
    from harness.emulator import EmulatorConfig, serve

    serve(
        EmulatorConfig(
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
        )
    )


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
    gpu: str | None = typer.Option(None, help="before launch: a GPU name (H100-80GB, L40S, ...) or its total GiB"),
    max_num_seqs: int | None = typer.Option(None, help="vLLM's --max-num-seqs (with --gpu)"),
    quantization: str | None = typer.Option(None, help="checkpoint format with --gpu: fp8, awq, gptq, mxfp4, ..."),
    field_check: Path | None = typer.Option(None, help="score the calculator on a field corpus directory"),
    json_output: bool = typer.Option(False, "--json", help="print the versioned JSON result"),
) -> None:
    """Predict KV bytes for a live-token population, the weights, and what vLLM makes of a KV budget."""
    from rich.console import Console

    from harness.budget_plan import BudgetOptions, plan_budget
    from harness.budget_table import budget_renderable
    from harness.model_shape import load_model_shape

    if field_check is not None:
        from harness.field_check import run_field_check
        from harness.field_report import field_renderable

        report = run_field_check(field_check)
        print(report.model_dump_json(indent=2)) if json_output else Console().print(field_renderable(report))
        return
    if gpu is not None:
        from harness.releases import PRODUCTION_ENGINE, engine_version_warnings
        from harness.fit_answer import answer_fit, answer_renderable

        for warning in engine_version_warnings(engine_version):
            print(f"warning: {warning}", file=sys.stderr)
        answer = answer_fit(
            load_model_shape(model, revision), gpu=gpu, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, asked_tokens=tokens, engine_version=engine_version or PRODUCTION_ENGINE,
            tensor_parallel_size=tensor_parallel_size, kv_cache_dtype=kv_cache_dtype, block_size=block_size,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, quantization=quantization,
        )
        print(answer.model_dump_json(indent=2)) if json_output else Console().print(answer_renderable(answer))
        return
    options = BudgetOptions(
        tokens=tokens, sequences=sequences, lengths=lengths, kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tensor_parallel_size, block_size=block_size, shared_prefix_tokens=shared_prefix_tokens,
        hybrid_kv_manager=hybrid_kv_manager, available_kv_gib=available_kv_gib,
        kv_cache_memory_bytes=kv_cache_memory_bytes, gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=gpu_memory_utilization, overhead_gib=overhead_gib, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens, engine_version=engine_version,
    )
    result = plan_budget(load_model_shape(model, revision), options)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if json_output:
        print(result.model_dump_json(indent=2))
    else:
        Console().print(budget_renderable(result))


prompts_app = typer.Typer(no_args_is_help=True, help="Frozen, token-counted prompt inventories.")
prompts_build_app = typer.Typer(no_args_is_help=True, help="Build an inventory; the same recipe gives the same bytes.")
prompts_app.add_typer(prompts_build_app, name="build")
app.add_typer(prompts_app, name="prompts")


@prompts_build_app.command("token-ids")
@one_line_errors
def prompts_build_token_ids(
    out: Path = typer.Argument(..., help="inventory directory to write"),
    vocab_high: int = typer.Option(..., help="one past the last allowed token id (special ids above it)"),
    vocab_low: int = typer.Option(0, help="first allowed token id"),
    exclude_ids: str = typer.Option("", help="comma-separated ids inside the range never to use"),
    prompt_tokens: str = typer.Option(..., help="comma-separated prompt lengths, tokens"),
    output_cap_tokens: str = typer.Option(..., help="one output cap for all, or one per prompt length"),
    count: int = typer.Option(1, help="prompts per listed length"),
    shared_prefix_tokens: int = typer.Option(0, help="leading tokens every prompt shares"),
    salt: str | None = typer.Option(None, help="per-run salt: unique leading tokens defeat prefix-cache hits"),
    seed: int = typer.Option(0, help="numpy Generator seed"),
    name: str | None = typer.Option(None, help="inventory name (default: the directory's name)"),
    tokenizer: str | None = typer.Option(None, help="tokenizer directory or hub id the ids are meant for: "
                                         "--vocab-high beyond it is refused, special ids in range warned about"),
    revision: str | None = typer.Option(None, help="pinned hub revision of --tokenizer"),
) -> None:
    """Seeded token-id prompts of exact lengths, sent to /v1/completions as-is."""
    from harness.inventory import write_inventory
    from harness.inventory_build import (
        build_token_id_inventory,
        check_vocabulary,
        int_list,
        token_id_recipe,
        token_shapes,
    )

    lengths, caps = token_shapes(prompt_tokens, output_cap_tokens, count)
    vocabulary = {"low": vocab_low, "high": vocab_high, "excluded_ids": int_list(exclude_ids, "--exclude-ids", minimum=0)}
    if tokenizer is not None:
        for warning in check_vocabulary(vocabulary, tokenizer, revision):
            print(f"warning: {warning}", file=sys.stderr)
    recipe = token_id_recipe(
        vocabulary=vocabulary,
        prompt_tokens=lengths,
        output_cap_tokens=caps,
        shared_prefix_tokens=shared_prefix_tokens,
        salt=salt,
        seed=seed,
    )
    inventory = build_token_id_inventory(name or out.name, recipe)
    write_inventory(inventory, out)
    print(f"{out}: {inventory.manifest.prompt_count} prompts, inventory_sha256 {inventory.digest}")


@prompts_build_app.command("text")
@one_line_errors
def prompts_build_text(
    out: Path = typer.Argument(..., help="inventory directory to write"),
    corpus: Path = typer.Option(..., help="UTF-8 text file to cut prompts from"),
    tokenizer: str = typer.Option(..., help="local tokenizer directory or hub id"),
    revision: str | None = typer.Option(None, help="pinned hub revision (required for a hub id)"),
    chat: bool = typer.Option(False, help="send as a chat message; count the templated prompt"),
    prompt_tokens: str = typer.Option(..., help="comma-separated prompt lengths, tokens"),
    output_cap_tokens: str = typer.Option(..., help="one output cap for all, or one per prompt length"),
    count: int = typer.Option(1, help="prompts per listed length"),
    seed: int = typer.Option(0, help="numpy Generator seed (picks corpus offsets)"),
    name: str | None = typer.Option(None, help="inventory name (default: the directory's name)"),
) -> None:
    """Corpus text cut to exact token counts as the server will count them."""
    from harness.inventory import write_inventory
    from harness.inventory_build import build_text_inventory, text_recipe, token_shapes

    lengths, caps = token_shapes(prompt_tokens, output_cap_tokens, count)
    recipe = text_recipe(
        corpus, tokenizer=tokenizer, tokenizer_revision=revision, chat=chat,
        prompt_tokens=lengths, output_cap_tokens=caps, seed=seed,
    )
    inventory = build_text_inventory(name or out.name, recipe)
    write_inventory(inventory, out)
    print(f"{out}: {inventory.manifest.prompt_count} prompts, inventory_sha256 {inventory.digest}")


@prompts_app.command("verify")
@one_line_errors
def prompts_verify(
    inventory_dir: Path = typer.Argument(..., help="inventory directory"),
    server: str | None = typer.Option(None, help="base URL of a running vLLM server to count every prompt"),
    max_model_len: int | None = typer.Option(None, help="refuse prompts whose prompt + output cap exceed it"),
    rebuild: bool = typer.Option(False, help="also rebuild from the manifest's recipe and compare"),
) -> None:
    """Re-hash an inventory (refusing any edit); optionally check it fits, rebuilds, and counts the same on a server."""
    from harness.inventory import load_inventory
    from harness.inventory_check import check_fits, verify_with_server
    from harness.inventory_build import check_rebuilds

    inventory = load_inventory(inventory_dir)
    if max_model_len is not None:
        check_fits(inventory, max_model_len)
    if rebuild:
        check_rebuilds(inventory)
    print(f"{inventory_dir}: intact, {inventory.manifest.prompt_count} prompts, inventory_sha256 {inventory.digest}")
    if server is None:
        return
    mismatches = verify_with_server(inventory, server)
    for mismatch in mismatches:
        print(f"mismatch {mismatch.describe()}")
    if mismatches:
        raise typer.Exit(1)
    print(f"{server}: all {inventory.manifest.prompt_count} prompt token counts match")


@app.command("run", epilog=EXIT_CODES_HELP)
@one_line_errors
def run_command(
    inventory: Path = typer.Option(..., help="prompt inventory directory"),
    out: Path = typer.Option(..., help="run record directory to write (refused if it holds a run)"),
    force: bool = typer.Option(False, help="move a run already in --out aside to OUT.replaced-<run id>"),
    base_url: str | None = typer.Option(None, help="server base URL, e.g. http://127.0.0.1:8000"),
    service_uuid: str | None = typer.Option(None, help="Polyaxon service run measured (reached in-cluster "
                                            "unless --base-url says where)"),
    service_port: int = typer.Option(8000, help="port of the Polyaxon service"),
    concurrency: int | None = typer.Option(None, help="closed loop: requests kept in flight"),
    rate: float | None = typer.Option(None, help="open loop: mean arrivals per second"),
    burstiness: float = typer.Option(1.0, help="gamma shape of inter-arrival times (1 = Poisson)"),
    max_concurrency: int | None = typer.Option(None, help="cap on in-flight requests under --rate"),
    max_tokens: int | None = typer.Option(None, help="output cap for every request (default: the inventory's)"),
    requests: int | None = typer.Option(None, help="measured requests (default: one pass over the inventory)"),
    duration_s: float | None = typer.Option(None, help="stop scheduling after this many seconds"),
    warmup: int = typer.Option(0, help="requests sent first and left out of the results"),
    seed: int = typer.Option(0, help="seed for arrivals and shuffling"),
    order: str = typer.Option("inventory", help="prompt order per pass: inventory or shuffled"),
    temperature: float = typer.Option(0.0, help="sampling temperature sent with every request"),
    slo_ttft_ms: float | None = typer.Option(None, help="goodput SLO on time to first token, ms"),
    slo_tpot_ms: float | None = typer.Option(None, help="goodput SLO on time per output token, ms"),
    cold: bool = typer.Option(False, help="declare the run cold: prefix-cache hits make it invalid"),
    sample_interval_s: float = typer.Option(1.0, help="seconds between /metrics scrapes"),
    max_dispatch_lag_ms: float = typer.Option(10.0, help="p99 dispatch lag above which the run is invalid"),
    max_error_fraction: float = typer.Option(0.05, help="share of failed requests above which the run is invalid"),
    read_timeout_s: float | None = typer.Option(None, help="longest wait for a request's first byte, s (default: "
                                                "60 + every request in flight producing its cap at 40 tokens/s)"),
    stall_timeout_s: float | None = typer.Option(None, help="no byte for this long once a response started ends "
                                                 "the request as 'stalled', s (default: 30 + 0.1 per request in "
                                                 "flight)"),
    ready_timeout_s: float = typer.Option(600.0, help="seconds to wait for the server's /health (progress on "
                                          "stderr; a server that answers but is not vLLM fails at once)"),
    project: str | None = typer.Option(None, envvar="HARNESS_PROJECT", help="track in this Polyaxon project"),
    offline_root: Path | None = typer.Option(None, envvar="HARNESS_OFFLINE_ROOT",
                                             help="track offline into this Polyaxon offline root"),
    engine: list[str] | None = typer.Argument(None, help="after --: an engine command line to start, "
                                              "measure and stop (a self-contained experiment)"),
) -> None:
    """Send an inventory at a set load; record every request, the server's metrics and a summary.

    With an engine command after `--`, start that engine first, keep its start-up log and capacity,
    and stop it afterwards: one run = one configuration.
    """
    from harness.experiment import measure
    from harness.launch import engine_base_url
    from harness.record import Slo, claim_run_dir
    from harness.run_options import build_run_config, command_line_options

    if engine and (base_url or service_uuid):
        raise HarnessError("an engine command after -- sets the server; drop --base-url/--service-uuid")
    options = command_line_options(
        inventory=inventory, base_url=engine_base_url(engine) if engine else base_url,
        service_uuid=service_uuid, service_port=service_port,
        load=dict(concurrency=concurrency, rate_per_s=rate, burstiness=burstiness, max_concurrency=max_concurrency,
                  requests=requests, duration_s=duration_s, warmup_requests=warmup, seed=seed, order=order),
        max_tokens=max_tokens, temperature=temperature, slo=Slo(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms),
        cold=cold, sample_interval_s=sample_interval_s, max_dispatch_lag_ms=max_dispatch_lag_ms,
        max_error_fraction=max_error_fraction, read_timeout_s=read_timeout_s, stall_timeout_s=stall_timeout_s,
    )
    config, prompts = build_run_config(options)
    moved = claim_run_dir(out, force=force)
    if moved is not None:
        print(f"moved the run that was in {out} to {moved}", file=sys.stderr)
    summary, tracked = measure(config, prompts, out, engine_argv=engine, ready_timeout_s=ready_timeout_s,
                               project=project, offline_root=offline_root)
    if tracked is not None:
        print(f"tracked as Polyaxon run {tracked.run_uuid} in {tracked.owner}/{tracked.project}", file=sys.stderr)
    if summary is None:  # not bad input: the record is the result, and says how far the engine got
        print(f"error: the engine did not start; its log and capacity are in {out}", file=sys.stderr)
        raise typer.Exit(EXIT_ENGINE_DID_NOT_START)
    print(summary.model_dump_json(indent=2))
    stopped = exit_code_for_signal(summary.stopped_by_signal)
    if stopped is not None:
        raise typer.Exit(stopped)
    if not summary.valid:
        print(f"invalid run: {'; '.join(summary.invalid_reasons)}", file=sys.stderr)
        raise typer.Exit(EXIT_INVALID)


@app.command()
@one_line_errors
def capacity(
    log: str | None = typer.Option(None, "--log", help="engine start-up log file, or - for stdin"),
    run: Path | None = typer.Option(None, "--run", help="local run directory holding the captured engine.log"),
    polyaxon_run: str | None = typer.Option(None, "--polyaxon-run", help="Polyaxon run UUID whose logs to read"),
    project: str | None = typer.Option(None, "--project", help="OWNER/NAME of the Polyaxon run"),
    metrics: str | None = typer.Option(None, "--metrics", help="/metrics URL (or a saved scrape) to cross-check"),
    model: str | None = typer.Option(None, help="model for the prediction (default: the one the log names)"),
    revision: str | None = typer.Option(None, help="hub revision of --model"),
    gpu: str | None = typer.Option(None, help="GPU name or total GiB, for the waterfall when the log lacks it"),
    engine_version: str | None = typer.Option(None, help="vLLM version, when the log does not state it"),
    tensor_parallel_size: int | None = typer.Option(None, help="tensor-parallel size, when the log does not state it"),
    kv_cache_dtype: str | None = typer.Option(None, help="KV cache dtype, when the log does not state it"),
    json_output: bool = typer.Option(False, "--json", help="print the versioned JSON report"),
) -> None:
    """The KV capacity the engine logged, /metrics beside it, and the calculator's prediction; exit 1 if none."""
    from rich.console import Console

    from harness.capacity import LogOverrides, capacity_from_sources
    from harness.capacity_table import capacity_renderable

    stated = LogOverrides(engine_version=engine_version, tensor_parallel_size=tensor_parallel_size,
                          kv_cache_dtype=kv_cache_dtype)

    report = capacity_from_sources(
        log=log, run_dir=run, polyaxon_run=polyaxon_run, project=project, metrics=metrics, model=model,
        revision=revision, gpu=gpu, stated=stated,
    )
    if json_output:
        print(report.model_dump_json(indent=2))
    else:
        Console().print(capacity_renderable(report))
    if report.log is not None and not report.log.capacity_found:
        raise typer.Exit(1)


model_app = typer.Typer(no_args_is_help=True, help="The generated tiny model the CPU engine serves.")
app.add_typer(model_app, name="model")


@model_app.command("tiny")
@one_line_errors
def model_tiny(seed: int = typer.Option(0, help="weights seed; the same seed gives byte-identical files")) -> None:
    """Generate the tiny Qwen3 model once (cached) and print its directory."""
    from harness.tiny_model import ensure_tiny_model

    print(ensure_tiny_model(seed))


def warn_overridden(names: list[str], params: dict[str, Any]) -> None:
    """A -P value that every sweep point replaces is legal but does nothing: say so."""
    for name in names:
        print(f"warning: -P {name}={params[name]} is not used: every point of the sweep sets {name}", file=sys.stderr)


@app.command()
@one_line_errors
def check(
    files: list[Path] = typer.Option(..., "-f", "--file", help="polyaxonfile, then presets (as for polyaxon run)"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
) -> None:
    """Compile a polyaxonfile (+ presets) with Polyaxon's compiler; a sweep is compiled point by point."""
    from harness.specs import check_files, overridden_params, parse_param_options

    params = parse_param_options(param)
    points = check_files(files, params)
    warn_overridden(overridden_params(files, params), params)
    described = " + ".join(str(path) for path in files)
    if points:
        print(f"{described}: valid, {len(points)} sweep points each compiled")
        for index, point in enumerate(points):
            print(f"  point {index}: {point}")
    else:
        print(f"{described}: valid")


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def serve(
    files: list[Path] = typer.Option(..., "-f", "--file", help="service polyaxonfile, then presets"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
    log: Path = typer.Option(Path(RunFile.ENGINE_LOG), help="file that receives the engine's stdout and stderr"),
    port: int | None = typer.Option(None, help="local port (default: a free one)"),
    health_timeout_s: float = typer.Option(300.0, help="seconds to wait for /health"),
) -> None:
    """Run a service polyaxonfile on the local vLLM engine until interrupted (Ctrl-C stops it cleanly, exit 130)."""
    from harness.launch import local_engine, wait_while_healthy
    from harness.specs import parse_param_options

    params = parse_param_options(param)
    with local_engine(files, params, log_path=log, port=port, health_timeout_s=health_timeout_s) as engine:
        try:
            print(f"engine healthy at {engine.base_url} (pid {engine.pid}, log {engine.log_path})", flush=True)
            wait_while_healthy(engine)
        except KeyboardInterrupt:  # the engine stops on the way out; the exit code says it was stopped
            print("stopping the engine", flush=True)
            raise


@app.command()
@one_line_errors
def report(
    runs: list[Path] = typer.Option([], "--runs", help="directory of run records, searched recursively (repeatable)"),
    offline_root: Path | None = typer.Option(None, help="Polyaxon offline root (holds runs/<uuid>/run.plx.json)"),
    project: str | None = typer.Option(None, help="OWNER/NAME of a Polyaxon project to read runs from"),
    query: str | None = typer.Option(None, help="Polyaxon query to select the project's runs"),
    api_limit: int = typer.Option(100, help="most runs to read from the Polyaxon API"),
    limit: str = typer.Option(..., "--limit", help="the one input the runs differ in, e.g. max_num_seqs"),
    out: Path = typer.Option(..., help="directory for report.md, report.html and the plots"),
) -> None:
    """Compare runs along one limit, say which limit bound each run, and write Markdown and HTML."""
    from analysis.report import write_report

    written = write_report(limit=limit, out=out, run_dirs=runs, offline_root=offline_root, project=project,
                           query=query, api_limit=api_limit)
    for verdict in written.verdicts:
        print(f"{verdict.run_uuid}: {verdict.bound_by}")
    print(f"report: {written.markdown} and {written.html}")
    from harness.polyaxon_client import managed_run
    from harness.tracking import track_report

    if managed_run():  # the report operation: the HTML becomes the run's artifact in the dashboard
        track_report(written.markdown, written.html, len(written.runs))


@app.command("run-local", epilog=EXIT_CODES_HELP)
@one_line_errors
def run_local(
    files: list[Path] = typer.Option(..., "-f", "--file", help="job polyaxonfile or sweep, then presets"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value, as for polyaxon run"),
    out: Path = typer.Option(Path("runs/local"), help="directory for each point's outputs"),
    offline_root: Path = typer.Option(Path("runs/polyaxon"), help="Polyaxon offline root the runs are tracked in"),
    project: str = typer.Option("local/vllm-harness", help="project the offline runs belong to"),
) -> None:
    """Execute a compiled experiment (or every point of its sweep) as local processes, tracked offline."""
    from harness.launch import stop_on_sigterm
    from harness.local_executor import run_locally
    from harness.specs import overridden_params, parse_param_options
    from harness.tracking import offline_tracking_env

    def announce(index: int, total: int, point: dict[str, object]) -> None:
        print(f"point {index + 1}/{total}: {point}", file=sys.stderr, flush=True)

    params = parse_param_options(param)
    warn_overridden(overridden_params(files, params), params)
    with stop_on_sigterm():
        runs = run_locally(files, params, out_root=out,
                           env=offline_tracking_env(offline_root, project), on_start=announce)
    for run in runs:
        print(f"point {run.index}: exit {run.exit_code}, outputs {run.outputs_dir}")
    print(f"offline runs in {offline_root} (polyaxon ops ls --offline --path {offline_root} -io)")
    if any(run.exit_code != 0 for run in runs):
        raise typer.Exit(EXIT_INVALID)


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def sweep(
    files: list[Path] = typer.Option(..., "-f", "--file", help="sweep polyaxonfile (its matrix gives the points)"),
    service_files: list[Path] = typer.Option([Path("polyaxonfiles/vllm-service.yaml")], "--service",
                                             help="service polyaxonfile, then its presets"),
    harness_files: list[Path] = typer.Option([Path("polyaxonfiles/harness-job.yaml")], "--harness",
                                             help="harness job polyaxonfile"),
    param: list[str] = typer.Option([], "-P", "--param", help="name=value for the service or the harness job"),
    project: str | None = typer.Option(None, help="Polyaxon project OWNER/NAME (required unless --local)"),
    local: bool = typer.Option(False, help="run the services on the local CPU engine and track offline"),
    queue: str | None = typer.Option(None, help="Polyaxon queue for the service runs"),
    running_deadline_s: float = typer.Option(1800.0, help="seconds a service may take to be running"),
    harness_deadline_s: float = typer.Option(7200.0, help="seconds a harness job may take"),
    out: Path = typer.Option(Path("runs/sweep"), help="directory for the sweep result and failed points' logs"),
) -> None:
    """Vary one limit over a vLLM service: start it, run the harness job against it, stop it; next point."""
    from harness.launch import stop_on_sigterm
    from harness.specs import parse_param_options
    from harness.sweep import (
        Backend,
        LocalBackend,
        Outcome,
        PolyaxonBackend,
        check_harness_params,
        run_sweep,
        service_params,
        sweep_points,
    )
    from harness.tracking import DEFAULT_PROJECT, offline_tracking_env

    if project is None and not local:
        raise HarnessError("give --project OWNER/NAME, or --local to run on this machine")
    params = parse_param_options(param)
    if (out / "sweep.json").exists():
        raise HarnessError(f"--out {out}: already holds a sweep ({out / 'sweep.json'}); give a new directory")
    limit, points = sweep_points(files, service_files, params)
    for_service = service_params(service_files, params)
    for_harness = {name: value for name, value in params.items() if name not in for_service}
    check_harness_params(harness_files, for_harness)
    warn_overridden([limit] if limit in params else [], params)
    backend: Backend
    if local:
        tracking = offline_tracking_env(out / "polyaxon", project or DEFAULT_PROJECT)
        backend = LocalBackend(service_files, harness_files, for_harness, out=out, env=tracking)
    else:
        backend = PolyaxonBackend(project, service_files, harness_files, for_harness, queue=queue,
                                  running_deadline_s=running_deadline_s, harness_deadline_s=harness_deadline_s,
                                  logs_dir=out / "logs",
                                  announce=lambda message: print(message, file=sys.stderr, flush=True))
    with stop_on_sigterm():
        result = run_sweep(files[0], limit, [{**for_service, **point} for point in points], backend,
                           on_point=lambda point: print(f"point {point.index}: {point.outcome}", flush=True))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")
    print(f"sweep over {limit}: {out / 'sweep.json'}")
    if any(point.outcome != Outcome.MEASURED for point in result.points):
        raise typer.Exit(EXIT_INVALID)


@app.command(epilog=EXIT_CODES_HELP)
@one_line_errors
def demo(
    out: Path | None = typer.Option(None, help="directory for the demo's runs and report (default: runs/demo-TIME)"),
    repeats: int = typer.Option(1, help="runs per point, each with its own engine: the report shows the spread"),
) -> None:
    """The whole loop on this machine: predict, launch the real CPU engine, measure a sweep, explain."""
    import time

    from rich.console import Console

    from harness.demo import run_demo
    from harness.launch import stop_on_sigterm

    console = Console() if sys.stdout.isatty() else Console(width=160)  # a log file is not 80 columns wide
    with stop_on_sigterm():
        result = run_demo(out or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S"), console, repeats)
    failed = f"; points that failed: {result.failed_points}" if result.failed_points else ""
    invalid = f"; invalid points: {result.invalid_points}" if result.invalid_points else ""
    print(f"demo finished in {result.seconds:.0f} s{failed}{invalid}")
    if result.failed_points or result.invalid_points:
        raise typer.Exit(EXIT_INVALID)
