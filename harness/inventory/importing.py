"""`harness prompts import`: a frozen inventory from the user's own traffic, counted as the server counts it.

Text is counted with the pinned tokenizer (a chat request's messages rendered with its template), so every
prompt's count is the server's whatever the log says; a log's own usage counts are compared and disagreements
reported. A ShareGPT conversation becomes one turn per exchange, each sent with its history as recorded, so a
run replays every turn, not only the first. With `--lengths-only` (and always for a CSV of counts) only the
lengths are kept: token-id prompts of those lengths (conversations whose turns repeat the turn before), so the
inventory can be shared without the user's data. The source file is pinned by its sha256; a text import is
rebuilt by importing that file again. Where a text import's single requests start with the same tokens (a
shared system prompt), each records where (`shared_prefixes`), for the prefix-cache prediction; a
conversation's turns share their history by the turns themselves.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydantic

from harness.errors import HarnessError, describe_validation_error
from harness.inventory.fields import MAX_PROMPTS, SharedPrefix, TokenizerIdentity
from harness.inventory.frozen import Inventory, InventoryPrompt, assemble_inventory, make_prompt
from harness.inventory.lengths import ImportedLengths, ImportFormat
from harness.inventory.recipe import ImportRecipe, TokenIdRecipe, VocabularyRange
from harness.inventory.shared_prefixes import find_shared_prefixes
from harness.inventory.tokenizer import TokenCounter, resolve_tokenizer
from harness.inventory.traffic import Record, Records, read_records
from harness.inventory.workload_recipes import ConversationLengthsRecipe, TurnLengths
from harness.paths import read_text

FORMATS: dict[str, ImportFormat] = {"openai": "openai", "sharegpt": "sharegpt", "csv": "csv"}
FORMATS_BY_SUFFIX: dict[str, ImportFormat] = {".jsonl": "openai", ".json": "sharegpt", ".csv": "csv"}
SAMPLE_STREAM = 2  # the seed's stream that picks the sample; the token ids use the seed itself


@dataclass(frozen=True)
class CountedRecord:
    record: Record
    prompt_tokens: int
    output_cap_tokens: int
    prompt_ids: list[int] | None = None  # as the server tokenizes the prompt; None for a CSV's counts


@dataclass(frozen=True)
class ImportedTraffic:
    """An import's inventory and its account of the source: what was skipped, and where the log's own
    usage counts disagree with the pinned tokenizer's."""

    inventory: Inventory
    found: Records
    usage_disagreements: list[tuple[int, int, int]]  # (line, the log's prompt_tokens, the tokenizer's count)


def import_format(file: Path, given: str | None) -> ImportFormat:
    fmt = FORMATS.get(given) if given is not None else FORMATS_BY_SUFFIX.get(file.suffix.lower())
    if fmt is not None:
        return fmt
    shown = f"--format {given!r}" if given is not None else f"FILE {file}: suffix {file.suffix!r}"
    raise HarnessError(f"{shown}: give --format openai (JSONL of requests), sharegpt (JSON conversations) "
                       "or csv (input and output token counts)")


def source_of(file: Path, fmt: str, sample: int | None, seed: int, *, conversations: bool) \
        -> tuple[str, Records, list[Record]]:
    """(sha256, every record found, the sample chosen in file order): refused in one line if the file holds
    a malformed record or none to replay. A conversation is one record: a sample takes whole conversations."""
    text = read_text(file, "FILE")
    found = read_records(file, text, fmt, conversations=conversations)
    if not found.records:
        skipped = ", ".join(f"{n} {reason}" for reason, n in found.skipped.items()) or "the file is empty"
        raise HarnessError(f"FILE {file}: no record to replay ({skipped})")
    if len(found.records) > MAX_PROMPTS and sample is None:
        raise HarnessError(f"FILE {file}: {len(found.records):,} records; give --sample N (at most {MAX_PROMPTS:,})")
    chosen = found.records
    if sample is not None:
        if sample > len(found.records):
            raise HarnessError(f"--sample {sample}: FILE {file} holds only {len(found.records):,} records to replay")
        rng = np.random.default_rng([seed, SAMPLE_STREAM])
        picked = np.sort(rng.choice(len(found.records), size=sample, replace=False))
        chosen = [found.records[int(i)] for i in picked]
    turns = sum(len(record.turns()) for record in chosen)
    if turns > MAX_PROMPTS:
        raise HarnessError(f"FILE {file}: {len(chosen):,} conversations of {turns:,} turns; an inventory holds at most "
                           f"{MAX_PROMPTS:,} (give a smaller --sample)")
    return hashlib.sha256(file.read_bytes()).hexdigest(), found, chosen


class _Counters:
    """The pinned tokenizer, as completions count (special tokens added) and as chat counts (the template)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.plain = TokenCounter(directory, chat=False)
        self._chat: TokenCounter | None = None

    def chat(self) -> TokenCounter:
        if self._chat is None:
            self._chat = TokenCounter(self.directory, chat=True)
        return self._chat

    def counted(self, file: Path, record: Record) -> CountedRecord:
        ids = None
        if record.messages is not None:
            ids = self.chat().message_ids([message.model_dump() for message in record.messages])
        elif record.text is not None:
            ids = self.plain.prompt_ids(record.text)
        prompt = (record.prompt_tokens or 0) if ids is None else len(ids)
        cap = record.output_tokens if record.reply is None else len(self.plain.encode(record.reply))
        if prompt < 1 or not cap:
            field = "messages" if record.messages is not None else "prompt"
            raise HarnessError(f"{file} line {record.line}: field '{field}': counts {prompt} prompt tokens and "
                               f"{cap} output tokens; a request needs at least one of each")
        return CountedRecord(record=record, prompt_tokens=prompt, output_cap_tokens=cap, prompt_ids=ids)


def counted_records(file: Path, fmt: str, chosen: list[Record], tokenizer: str | None, revision: str | None) \
        -> tuple[list[list[CountedRecord]], TokenizerIdentity | None]:
    """Every chosen record's turns (one for a single request) with their prompt and output tokens: a CSV's own
    counts, else the tokenizer's, each turn's prompt its whole history rendered with the template."""
    if fmt == "csv":
        return [[CountedRecord(r, r.prompt_tokens or 0, r.output_tokens or 0)] for r in chosen], None
    if tokenizer is None:
        raise HarnessError(f"--tokenizer: a {fmt} import counts text, so it needs the tokenizer the server uses")
    directory, identity = resolve_tokenizer(tokenizer, revision)
    counters = _Counters(directory)
    return [[counters.counted(file, turn) for turn in record.turns()] for record in chosen], identity


def import_text(name: str, recipe: ImportRecipe) -> ImportedTraffic:
    """The records' own prompts (text, or the recorded messages), counted; also how an import is rebuilt."""
    file = Path(recipe.source)
    sha, found, chosen = source_of(file, recipe.format, recipe.sample, recipe.seed,
                                   conversations=recipe.conversations)
    if sha != recipe.source_sha256:
        raise HarnessError(f"source {file}: its sha256 differs from the recipe's source_sha256")
    counted, identity = counted_records(file, recipe.format, chosen, recipe.tokenizer, recipe.tokenizer_revision)
    if recipe.conversations:
        prompts = [_turn_prompt(index, number, turn) for index, turns in enumerate(counted)
                   for number, turn in enumerate(turns, start=1)]
    else:
        shared = find_shared_prefixes([turns[0].prompt_ids or [] for turns in counted])
        prompts = [_text_prompt(index, turns[0], prefixes or None)
                   for index, (turns, prefixes) in enumerate(zip(counted, shared, strict=True))]
    return ImportedTraffic(inventory=assemble_inventory(name, recipe, identity, prompts), found=found,
                           usage_disagreements=_disagreements(counted))


def _turn_prompt(index: int, number: int, entry: CountedRecord) -> InventoryPrompt:
    """Turn `number` of conversation `index`: its messages as recorded, the history first."""
    conversation = f"c{index:04d}"
    return make_prompt(f"{conversation}t{number:02d}", entry.prompt_tokens, entry.output_cap_tokens,
                       messages=entry.record.messages, conversation_id=conversation, turn=number)


def _text_prompt(index: int, entry: CountedRecord, shared: list[SharedPrefix] | None) -> InventoryPrompt:
    record, prompt_id = entry.record, f"p{index:04d}"
    messages = record.messages
    if messages is not None and len(messages) == 1 and messages[0].role == "user":
        # one user message: the form every chat inventory has (text sent as one user turn)
        return make_prompt(prompt_id, entry.prompt_tokens, entry.output_cap_tokens, text=messages[0].content,
                           chat=True, shared_prefixes=shared)
    return make_prompt(prompt_id, entry.prompt_tokens, entry.output_cap_tokens, text=record.text, messages=messages,
                       shared_prefixes=shared)


def import_lengths(name: str, file: Path, fmt: ImportFormat, *, tokenizer: str | None, revision: str | None,
                   sample: int | None, seed: int, vocabulary: dict[str, object], conversations: bool) \
        -> ImportedTraffic:
    """Token-id prompts of the records' lengths (conversations of token ids when `conversations`): the text
    stays with the user."""
    from harness.inventory.build import build_token_id_inventory
    from harness.inventory.prefix_groups import build_conversation_lengths_inventory

    sha, found, chosen = source_of(file, fmt, sample, seed, conversations=conversations)
    counted, identity = counted_records(file, fmt, chosen, tokenizer, revision)
    provenance = ImportedLengths(format=fmt, source=file.name, source_sha256=sha, records=len(found.records),
                                 skipped_records=sum(found.skipped.values()), sample=sample, tokenizer=identity)
    allowed = _vocabulary(vocabulary)
    try:
        if conversations:
            recipe = ConversationLengthsRecipe(vocabulary=allowed, conversations=_turn_lengths(file, counted),
                                               seed=seed, lengths=provenance)
            inventory = build_conversation_lengths_inventory(name, recipe)
        else:
            plain = TokenIdRecipe(vocabulary=allowed, prompt_tokens=[c[0].prompt_tokens for c in counted],
                                  output_cap_tokens=[c[0].output_cap_tokens for c in counted], seed=seed,
                                  lengths=provenance)
            inventory = build_token_id_inventory(name, plain)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, "token-id recipe")) from None
    return ImportedTraffic(inventory=inventory, found=found, usage_disagreements=_disagreements(counted))


def _vocabulary(vocabulary: dict[str, object]) -> VocabularyRange:
    try:
        return VocabularyRange.model_validate(vocabulary)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, "--vocab-low/--vocab-high/--exclude-ids")) from None


def _turn_lengths(file: Path, counted: list[list[CountedRecord]]) -> list[list[TurnLengths]]:
    """Each conversation's turns as lengths. A turn whose prompt is not longer than the one before (a template
    that leaves part of the history out) has no turn-before-it to repeat: refused, naming its record."""
    conversations = []
    for turns in counted:
        for number, (earlier, later) in enumerate(itertools.pairwise(turns), start=2):
            if later.prompt_tokens <= earlier.prompt_tokens:
                raise HarnessError(f"{file} line {later.record.line}: field 'conversations': turn {number} counts "
                                   f"{later.prompt_tokens} prompt tokens, turn {number - 1} {earlier.prompt_tokens}; "
                                   "the template drops history, so its lengths cannot stand as a conversation")
        conversations.append([TurnLengths(prompt_tokens=t.prompt_tokens, output_cap_tokens=t.output_cap_tokens)
                              for t in turns])
    return conversations


def _disagreements(counted: list[list[CountedRecord]]) -> list[tuple[int, int, int]]:
    return [(c.record.line, c.record.prompt_tokens, c.prompt_tokens) for turns in counted for c in turns
            if c.record.prompt_tokens is not None and (c.record.text is not None or c.record.messages is not None)
            and c.record.prompt_tokens != c.prompt_tokens]
