"""`harness prompts`: build and verify frozen, token-counted inventories."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from harness.cli.app import app, one_line_errors
from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.inventory.importing import ImportedTraffic

prompts_app = typer.Typer(no_args_is_help=True, help="Frozen, token-counted prompt inventories.")
prompts_build_app = typer.Typer(no_args_is_help=True, help="Build an inventory; the same recipe gives the same bytes.")
prompts_app.add_typer(prompts_build_app, name="build")
app.add_typer(prompts_app, name="prompts")
PROMPT_TOKENS_HELP = ("comma-separated prompt lengths, or a distribution: fixed:N, uniform:min=A,max=B, "
                      "normal:mean=M,sd=S, lognormal:median=M,sigma=S, empirical:file=HIST.csv; each with "
                      "optional min=,max= bounds")
OUTPUT_CAP_TOKENS_HELP = "one output cap for all, one per listed prompt length, or a distribution"


@prompts_build_app.command("token-ids")
@one_line_errors
def prompts_build_token_ids(
    out: Path = typer.Argument(..., help="inventory directory to write"),
    vocab_high: int = typer.Option(..., help="one past the last allowed token id (special ids above it)"),
    vocab_low: int = typer.Option(0, help="first allowed token id"),
    exclude_ids: str = typer.Option("", help="comma-separated ids inside the range never to use"),
    prompt_tokens: str = typer.Option(..., help=PROMPT_TOKENS_HELP),
    output_cap_tokens: str = typer.Option(..., help=OUTPUT_CAP_TOKENS_HELP),
    count: int = typer.Option(1, help="prompts per listed length; with a distribution, prompts in all"),
    shared_prefix_tokens: int = typer.Option(0, help="leading tokens every prompt (of a group) shares"),
    prefix_groups: int | None = typer.Option(None, help="groups of prompts, each sharing its own prefix of "
                                             "--shared-prefix-tokens"),
    prompts_per_group: int | None = typer.Option(None, help="with --prefix-groups: prompts in each group"),
    salt: str | None = typer.Option(None, help="per-run salt: unique leading tokens defeat prefix-cache hits"),
    seed: int = typer.Option(0, help="numpy Generator seed"),
    name: str | None = typer.Option(None, help="inventory name (default: the directory's name)"),
    tokenizer: str | None = typer.Option(None, help="tokenizer directory or hub id the ids are meant for: "
                                         "--vocab-high beyond it is refused, special ids in range warned about"),
    revision: str | None = typer.Option(None, help="pinned hub revision of --tokenizer"),
) -> None:
    """Seeded token-id prompts of exact lengths, sent to /v1/completions as-is."""
    from harness.inventory.build import (
        build_token_id_inventory,
        drawn_shapes,
        int_list,
        inventory_directory,
        inventory_name,
        token_id_recipe,
    )
    from harness.inventory.frozen import write_inventory
    from harness.inventory.tokenizer import check_vocabulary

    inventory_directory(out)
    name = inventory_name(name, out)
    lengths, caps, drawn = drawn_shapes(prompt_tokens, output_cap_tokens, count, seed)
    excluded = int_list(exclude_ids, "--exclude-ids", minimum=0)
    vocabulary = {"low": vocab_low, "high": vocab_high, "excluded_ids": excluded}
    if tokenizer is not None:
        for warning in check_vocabulary(vocabulary, tokenizer, revision):
            print(f"warning: {warning}", file=sys.stderr)
    if (prefix_groups is None) != (prompts_per_group is None):
        raise HarnessError("--prefix-groups and --prompts-per-group: give both (groups of prompts sharing a prefix) "
                           "or neither")
    if prefix_groups is not None:
        from harness.inventory.prefix_groups import build_prefix_group_inventory, prefix_group_recipe

        if drawn is not None:
            raise HarnessError("--prompt-tokens: prefix groups take listed lengths, not a distribution")
        inventory = build_prefix_group_inventory(name, prefix_group_recipe(
            lengths, caps, prefix_groups, prompts_per_group=prompts_per_group, vocabulary=vocabulary,
            shared_prefix_tokens=shared_prefix_tokens, salt=salt, seed=seed))
    else:
        inventory = build_token_id_inventory(name, token_id_recipe(
            vocabulary=vocabulary, prompt_tokens=lengths, output_cap_tokens=caps,
            shared_prefix_tokens=shared_prefix_tokens, salt=salt, seed=seed, lengths=drawn))
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
    prompt_tokens: str = typer.Option(..., help=PROMPT_TOKENS_HELP),
    output_cap_tokens: str = typer.Option(..., help=OUTPUT_CAP_TOKENS_HELP),
    count: int = typer.Option(1, help="prompts per listed length; with a distribution, prompts in all"),
    seed: int = typer.Option(0, help="numpy Generator seed (picks corpus offsets)"),
    name: str | None = typer.Option(None, help="inventory name (default: the directory's name)"),
) -> None:
    """Corpus text cut to exact token counts as the server will count them."""
    from harness.inventory.build import (
        build_text_inventory,
        drawn_shapes,
        inventory_directory,
        inventory_name,
        text_recipe,
    )
    from harness.inventory.frozen import write_inventory

    inventory_directory(out)
    name = inventory_name(name, out)
    lengths, caps, drawn = drawn_shapes(prompt_tokens, output_cap_tokens, count, seed)
    recipe = text_recipe(
        corpus, tokenizer=tokenizer, tokenizer_revision=revision, chat=chat,
        prompt_tokens=lengths, output_cap_tokens=caps, seed=seed, lengths=drawn,
    )
    inventory = build_text_inventory(name, recipe)
    write_inventory(inventory, out)
    print(f"{out}: {inventory.manifest.prompt_count} prompts, inventory_sha256 {inventory.digest}")


@prompts_app.command("import")
@one_line_errors
def prompts_import(
    file: Path = typer.Argument(..., help="the traffic: OpenAI-format JSONL, ShareGPT JSON or a CSV of token counts"),
    out: Path = typer.Argument(..., help="inventory directory to write"),
    format: str | None = typer.Option(None, help="openai, sharegpt or csv (default: from FILE's suffix)"),
    tokenizer: str | None = typer.Option(None, help="the server's tokenizer (directory or hub id) to count text"),
    revision: str | None = typer.Option(None, help="pinned hub revision of --tokenizer"),
    sample: int | None = typer.Option(None, help="import N records (conversations, whole) by --seed (default: all)"),
    seed: int = typer.Option(0, help="numpy Generator seed (the sample; token ids of a lengths-only import)"),
    lengths_only: bool = typer.Option(False, help="keep only the lengths: token-id prompts, none of the text"),
    first_exchange: bool = typer.Option(False, help="ShareGPT: only each conversation's first question and answer, "
                                        "as single requests (default: every turn, each sent with its history)"),
    vocab_high: int | None = typer.Option(None, help="token ids for lengths-only and CSV imports: one past the last"),
    vocab_low: int = typer.Option(0, help="first allowed token id (lengths-only and CSV imports)"),
    exclude_ids: str = typer.Option("", help="comma-separated ids inside the range never to use"),
    name: str | None = typer.Option(None, help="inventory name (default: the directory's name)"),
) -> None:
    """Freeze the user's own traffic: every prompt counted as the server counts it; nothing written on a bad record."""
    from harness.inventory.build import int_list, inventory_directory, inventory_name
    from harness.inventory.frozen import write_inventory
    from harness.inventory.importing import import_format, import_lengths, import_text, source_of
    from harness.inventory.recipe import ImportRecipe
    from harness.paths import input_file

    input_file(file, "FILE")
    fmt = import_format(file, format)
    inventory_directory(out)
    name = inventory_name(name, out)
    if sample is not None and sample < 1:
        raise HarnessError(f"--sample: {sample} is not a positive number of records")
    if first_exchange and fmt != "sharegpt":
        raise HarnessError(f"--first-exchange: --format {fmt} holds no conversations to cut (only sharegpt does)")
    conversations = fmt == "sharegpt" and not first_exchange
    if fmt == "csv" or lengths_only:
        if vocab_high is None:
            raise HarnessError("--vocab-high: a lengths-only or CSV import makes token-id prompts; give the "
                               "vocabulary's range (see prompts/README.md)")
        vocabulary = {"low": vocab_low, "high": vocab_high,
                      "excluded_ids": int_list(exclude_ids, "--exclude-ids", minimum=0)}
        imported = import_lengths(name, file, fmt, tokenizer=tokenizer, revision=revision, sample=sample,
                                  seed=seed, vocabulary=vocabulary, conversations=conversations)
    else:
        sha, _, _ = source_of(file, fmt, sample, seed, conversations=conversations)
        if tokenizer is None:
            raise HarnessError(f"--tokenizer: a {fmt} import counts text, so it needs the tokenizer the server uses")
        recipe = ImportRecipe(format=fmt, source=str(file), source_sha256=sha, tokenizer=tokenizer,
                              tokenizer_revision=revision, sample=sample, seed=seed, conversations=conversations)
        imported = import_text(name, recipe)
    for line, logged, counted in imported.usage_disagreements[:5]:
        print(f"warning: {file} line {line}: usage.prompt_tokens {logged} but the tokenizer counts {counted}: "
              "the log came from another tokenizer or template", file=sys.stderr)
    write_inventory(imported.inventory, out)
    _print_imported(imported, file, out)


def _print_imported(imported: ImportedTraffic, file: Path, out: Path) -> None:
    """What was written, and what of the source was not: skipped records, turns left out."""
    found = imported.found
    notes = [f"{n} skipped: {reason}" for reason, n in found.skipped.items()]
    if found.later_turns:
        notes.append(f"{found.later_turns} conversation(s) went on after the first exchange; only that is imported")
    if found.cut_conversations:
        notes.append(f"{found.cut_conversations} conversation(s) kept up to a question with no answer or an empty "
                     "turn")
    conversations = {p.conversation_id for p in imported.inventory.prompts if p.conversation_id is not None}
    turns = f" ({len(conversations)} conversations)" if conversations else ""
    print(f"{out}: {imported.inventory.manifest.prompt_count} prompts{turns} from {len(found.records)} records of "
          f"{file}" + (f" ({'; '.join(notes)})" if notes else "") + f", inventory_sha256 {imported.inventory.digest}")


@prompts_build_app.command("conversations")
@one_line_errors
def prompts_build_conversations(
    out: Path = typer.Argument(..., help="inventory directory to write"),
    vocab_high: int = typer.Option(..., help="one past the last allowed token id (special ids above it)"),
    vocab_low: int = typer.Option(0, help="first allowed token id"),
    exclude_ids: str = typer.Option("", help="comma-separated ids inside the range never to use"),
    conversations: int = typer.Option(..., help="conversations to build"),
    turns: str = typer.Option(..., help="turns per conversation: N, or LOW-HIGH drawn uniformly"),
    user_tokens: str = typer.Option(..., help="tokens of each user message: N or LOW-HIGH"),
    assistant_tokens: str = typer.Option(..., help="tokens of each recorded reply: N or LOW-HIGH"),
    output_cap_tokens: int = typer.Option(..., help="each turn's max_tokens"),
    salt: str | None = typer.Option(None, help="per-run salt: each conversation's first tokens its own"),
    seed: int = typer.Option(0, help="numpy Generator seed"),
    name: str | None = typer.Option(None, help="inventory name (default: the directory's name)"),
) -> None:
    """Synthetic conversations of token ids: each turn's prompt is the whole history so far, then its message."""
    from harness.inventory.build import int_list, inventory_directory, inventory_name
    from harness.inventory.frozen import write_inventory
    from harness.inventory.prefix_groups import build_conversation_inventory, conversation_recipe, token_range

    inventory_directory(out)
    name = inventory_name(name, out)
    recipe = conversation_recipe(
        vocabulary={"low": vocab_low, "high": vocab_high,
                    "excluded_ids": int_list(exclude_ids, "--exclude-ids", minimum=0)},
        conversations=conversations, turns=token_range(turns, "--turns"),
        user_tokens=token_range(user_tokens, "--user-tokens"),
        assistant_tokens=token_range(assistant_tokens, "--assistant-tokens"),
        output_cap_tokens=output_cap_tokens, salt=salt, seed=seed,
    )
    inventory = build_conversation_inventory(name, recipe)
    write_inventory(inventory, out)
    print(f"{out}: {conversations} conversations, {inventory.manifest.prompt_count} turns, "
          f"inventory_sha256 {inventory.digest}")


@prompts_app.command("reuse")
@one_line_errors
def prompts_reuse(
    inventory_dir: Path = typer.Argument(..., help="inventory directory"),
    block_size: int = typer.Option(..., help="the engine's KV-cache block size, tokens"),
    cache_blocks: int | None = typer.Option(None, help="usable KV-cache blocks: flags possible evictions"),
) -> None:
    """The prefix-cache hits one pass over the inventory should give, in inventory order, before it runs."""
    from harness.inventory.frozen import load_inventory
    from harness.inventory.segments import sent_prompts
    from harness.predict.prefix_cache import predict_prefix_hits

    if block_size < 1:
        raise HarnessError(f"--block-size: {block_size} is not a positive number of tokens")
    if cache_blocks is not None and cache_blocks < 1:
        raise HarnessError(f"--cache-blocks: {cache_blocks} is not a positive number of blocks")
    inventory = load_inventory(inventory_dir)
    sent = sent_prompts(inventory, [(p.prompt_id, p.output_cap_tokens) for p in inventory.prompts])
    prediction = predict_prefix_hits(sent, block_size, cache_blocks)
    evictions = {None: "", False: ", no eviction", True: ", evictions possible (an upper bound)"}
    print(f"{inventory_dir}: {prediction.queried_tokens} prompt tokens queried, {prediction.hit_tokens} hit in "
          f"blocks of {block_size}; {prediction.blocks_needed} blocks needed{evictions[prediction.eviction_possible]}")


@prompts_app.command("verify")
@one_line_errors
def prompts_verify(
    inventory_dir: Path = typer.Argument(..., help="inventory directory"),
    server: str | None = typer.Option(None, help="base URL of a running vLLM server to count every prompt"),
    max_model_len: int | None = typer.Option(None, help="refuse prompts whose prompt + output cap exceed it"),
    rebuild: bool = typer.Option(False, help="also rebuild from the manifest's recipe and compare"),
) -> None:
    """Re-hash an inventory (refusing any edit); optionally check it fits, rebuilds, and counts the same on a server."""
    from harness.inventory.build import check_rebuilds
    from harness.inventory.check import check_fits, verify_with_server
    from harness.inventory.frozen import load_inventory
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
