"""`harness prompts import`: a frozen inventory from the user's own traffic, counted as the server counts it.

Text is counted with the pinned tokenizer (a chat request's messages rendered with its template), so every
prompt's count is the server's whatever the log says; a log's own usage counts are compared and disagreements
reported. With `--lengths-only` (and always for a CSV of counts) only the lengths are kept: token-id prompts of
those lengths, so the inventory can be shared without the user's data. The source file is pinned by its
sha256; a text import is rebuilt by importing that file again. Where a text import's prompts start with the
same tokens (a shared system prompt), each records where (`shared_prefixes`), for the prefix-cache prediction.
"""

from __future__ import annotations

import hashlib
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


def source_of(file: Path, fmt: str, sample: int | None, seed: int) -> tuple[str, Records, list[Record]]:
    """(sha256, every record found, the sample chosen in file order): refused in one line if the file holds
    a malformed record or none to replay."""
    text = read_text(file, "FILE")
    found = read_records(file, text, fmt)
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
        -> tuple[list[CountedRecord], TokenizerIdentity | None]:
    """Every chosen record with its prompt and output tokens: a CSV's own counts, else the tokenizer's."""
    if fmt == "csv":
        return [CountedRecord(r, r.prompt_tokens or 0, r.output_tokens or 0) for r in chosen], None
    if tokenizer is None:
        raise HarnessError(f"--tokenizer: a {fmt} import counts text, so it needs the tokenizer the server uses")
    directory, identity = resolve_tokenizer(tokenizer, revision)
    counters = _Counters(directory)
    return [counters.counted(file, record) for record in chosen], identity


def import_text(name: str, recipe: ImportRecipe) -> ImportedTraffic:
    """The records' own prompts (text, or the recorded messages), counted; also how an import is rebuilt."""
    file = Path(recipe.source)
    sha, found, chosen = source_of(file, recipe.format, recipe.sample, recipe.seed)
    if sha != recipe.source_sha256:
        raise HarnessError(f"source {file}: its sha256 differs from the recipe's source_sha256")
    counted, identity = counted_records(file, recipe.format, chosen, recipe.tokenizer, recipe.tokenizer_revision)
    shared = find_shared_prefixes([entry.prompt_ids or [] for entry in counted])
    prompts = [_text_prompt(index, entry, prefixes or None)
               for index, (entry, prefixes) in enumerate(zip(counted, shared, strict=True))]
    return ImportedTraffic(inventory=assemble_inventory(name, recipe, identity, prompts), found=found,
                           usage_disagreements=_disagreements(counted))


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
                   sample: int | None, seed: int, vocabulary: dict[str, object]) -> ImportedTraffic:
    """Token-id prompts of the records' lengths: the text stays with the user."""
    from harness.inventory.build import build_token_id_inventory

    sha, found, chosen = source_of(file, fmt, sample, seed)
    counted, identity = counted_records(file, fmt, chosen, tokenizer, revision)
    provenance = ImportedLengths(format=fmt, source=file.name, source_sha256=sha, records=len(found.records),
                                 skipped_records=sum(found.skipped.values()), sample=sample, tokenizer=identity)
    try:
        recipe = TokenIdRecipe(vocabulary=VocabularyRange.model_validate(vocabulary),
                               prompt_tokens=[c.prompt_tokens for c in counted],
                               output_cap_tokens=[c.output_cap_tokens for c in counted], seed=seed,
                               lengths=provenance)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, "token-id recipe")) from None
    return ImportedTraffic(inventory=build_token_id_inventory(name, recipe), found=found,
                           usage_disagreements=_disagreements(counted))


def _disagreements(counted: list[CountedRecord]) -> list[tuple[int, int, int]]:
    return [(c.record.line, c.record.prompt_tokens, c.prompt_tokens) for c in counted
            if c.record.prompt_tokens is not None and (c.record.text is not None or c.record.messages is not None)
            and c.record.prompt_tokens != c.prompt_tokens]
