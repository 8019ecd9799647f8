"""`harness prompts` and `harness run`: build and verify frozen inventories; send one at a set load."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from harness.cli.app import app, one_line_errors
from harness.errors import EXIT_CODES_HELP, EXIT_ENGINE_DID_NOT_START, EXIT_INVALID, HarnessError, exit_code_for_signal
from harness.measure.timeouts import READY_TIMEOUT_S

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
    from harness.measure.inventory import write_inventory
    from harness.measure.inventory_build import (
        build_token_id_inventory,
        check_vocabulary,
        int_list,
        inventory_directory,
        inventory_name,
        token_id_recipe,
        token_shapes,
    )

    inventory_directory(out)
    name = inventory_name(name, out)
    lengths, caps = token_shapes(prompt_tokens, output_cap_tokens, count)
    excluded = int_list(exclude_ids, "--exclude-ids", minimum=0)
    vocabulary = {"low": vocab_low, "high": vocab_high, "excluded_ids": excluded}
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
    inventory = build_token_id_inventory(name, recipe)
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
    from harness.measure.inventory import write_inventory
    from harness.measure.inventory_build import (
        build_text_inventory,
        inventory_directory,
        inventory_name,
        text_recipe,
        token_shapes,
    )

    inventory_directory(out)
    name = inventory_name(name, out)
    lengths, caps = token_shapes(prompt_tokens, output_cap_tokens, count)
    recipe = text_recipe(
        corpus, tokenizer=tokenizer, tokenizer_revision=revision, chat=chat,
        prompt_tokens=lengths, output_cap_tokens=caps, seed=seed,
    )
    inventory = build_text_inventory(name, recipe)
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
    from harness.measure.inventory import load_inventory
    from harness.measure.inventory_build import check_rebuilds
    from harness.measure.inventory_check import check_fits, verify_with_server
    from harness.server_url import checked_server_url

    if server is not None:
        checked_server_url(server, "--server")
    if max_model_len is not None and max_model_len < 1:
        raise HarnessError(f"--max-model-len: {max_model_len} is not a positive number of tokens")
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
    sample_interval_s: float = typer.Option(5.0, help="seconds between /metrics scrapes (each holds vLLM's "
                                            "API server a few ms)"),
    max_dispatch_lag_ms: float = typer.Option(10.0, help="p99 dispatch lag above which the run is invalid"),
    max_error_fraction: float = typer.Option(0.05, help="share of failed requests above which the run is invalid"),
    read_timeout_s: float | None = typer.Option(None, help="longest wait for a request's first byte, s (default: "
                                                "60 + every request in flight producing its cap at 40 tokens/s)"),
    stall_timeout_s: float | None = typer.Option(None, help="no byte for this long once a response started ends "
                                                 "the request as 'stalled' (at most 5% later), s (default: 30 + "
                                                 "0.1 per request in flight)"),
    ready_timeout_s: float = typer.Option(READY_TIMEOUT_S, help="seconds to wait for the server's /health (progress on "
                                          "stderr; a server that answers but is not vLLM fails at once)"),
    project: str | None = typer.Option(None, envvar="HARNESS_PROJECT", help="track in this Polyaxon project: "
                                       "OWNER/NAME, or NAME for default/NAME"),
    offline_root: Path | None = typer.Option(None, envvar="HARNESS_OFFLINE_ROOT",
                                             help="track offline into this Polyaxon offline root"),
    engine: list[str] | None = typer.Argument(None, help="after --: an engine command line to start, "
                                              "measure and stop (a self-contained experiment)"),
) -> None:
    """Send an inventory at a set load; record every request, the server's metrics and a summary.

    With an engine command after `--`, start that engine first, keep its start-up log and capacity,
    and stop it afterwards: one run = one configuration.
    """
    from harness.launch.engine_process import engine_base_url
    from harness.launch.experiment import measure
    from harness.measure.record import claimed_run_dir, run_dir_plan
    from harness.measure.run_options import build_run_config, command_line_options
    from harness.measure.timeouts import positive_seconds
    from harness.paths import output_directory
    from harness.polyaxon_project import parse_project

    if engine and (base_url or service_uuid):
        raise HarnessError("an engine command after -- sets the server; drop --base-url/--service-uuid")
    options = command_line_options(
        inventory=inventory, base_url=engine_base_url(engine) if engine else base_url,
        service_uuid=service_uuid, service_port=service_port,
        load=dict(concurrency=concurrency, rate_per_s=rate, burstiness=burstiness, max_concurrency=max_concurrency,
                  requests=requests, duration_s=duration_s, warmup_requests=warmup, seed=seed, order=order),
        max_tokens=max_tokens, temperature=temperature, slo=dict(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms),
        cold=cold, sample_interval_s=sample_interval_s, max_dispatch_lag_ms=max_dispatch_lag_ms,
        max_error_fraction=max_error_fraction, read_timeout_s=read_timeout_s, stall_timeout_s=stall_timeout_s,
    )
    positive_seconds(ready_timeout_s, "--ready-timeout-s")
    run_dir_plan(out, force=force)  # everything is checked before the record's folder is made
    if project is not None:
        parse_project(project)
    if offline_root is not None:
        output_directory(offline_root, "--offline-root")
    config, prompts = build_run_config(options)
    with claimed_run_dir(out, force=force) as moved:
        summary, tracked = measure(config, prompts, out, engine_argv=engine, ready_timeout_s=ready_timeout_s,
                                   project=project, offline_root=offline_root)
    if moved is not None:
        print(f"moved the run that was in {out} to {moved}", file=sys.stderr)
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
