"""The pinned tokenizer, counting as the server counts: completions add the special tokens, chat renders the
template with the generation prompt and adds none. Builders and imports count every prompt with it, so an
inventory's counts are the server's.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

from harness.errors import HarnessError
from harness.inventory.fields import TokenizerIdentity

# The files that decide how a tokenizer splits text and renders the chat template.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def check_vocabulary(vocabulary: dict[str, Any], tokenizer: str, revision: str | None) -> list[str]:
    """Token ids the tokenizer does not have cannot be served: refused. Special ids inside the range are
    legal but act as control tokens: returned as warnings."""
    directory, _ = resolve_tokenizer(tokenizer, revision)
    loaded = TokenCounter(directory, chat=False).tokenizer
    size = len(loaded)
    high, low = vocabulary["high"], vocabulary.get("low", 0)
    if high > size:
        raise HarnessError(f"--vocab-high {high}: tokenizer {tokenizer} has {size:,} ids (0 to {size - 1}); "
                           f"give at most {size}")
    excluded = set(vocabulary.get("excluded_ids") or [])
    special = sorted(i for i in set(loaded.all_special_ids) if low <= i < high and i not in excluded)
    if not special:
        return []
    shown = ",".join(str(i) for i in special[:10])
    return [f"ids {shown} in [{low}, {high}) are tokenizer {tokenizer}'s special tokens; "
            f"add them to --exclude-ids unless that is meant"]


def resolve_tokenizer(source: str, revision: str | None) -> tuple[Path, TokenizerIdentity]:
    """A local directory as is, or a hub id at a pinned revision (from the local cache when offline)."""
    if not source.strip():
        raise HarnessError("--tokenizer: empty; give a tokenizer directory or a hub id")
    if revision is not None and not revision.strip():
        raise HarnessError("--revision: empty; give the hub revision, or leave the option out for a directory")
    directory = Path(source)
    if not directory.is_dir():
        if revision is None:
            raise HarnessError(f"tokenizer {source}: not a local directory, and a hub id needs --revision")
        from huggingface_hub import snapshot_download

        try:
            directory = Path(
                snapshot_download(source, revision=revision, allow_patterns=list(TOKENIZER_FILES))
            )
        except Exception as error:  # the hub client raises many unrelated types for one cause
            raise HarnessError(f"tokenizer {source}@{revision}: cannot be fetched: {error}") from None
    files = sorted(directory / name for name in TOKENIZER_FILES if (directory / name).is_file())
    if not files:
        raise HarnessError(f"tokenizer {source}: no tokenizer files in {directory}")
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\x00" + file.read_bytes() + b"\x00")
    return directory, TokenizerIdentity(name=source, revision=revision, files_sha256=digest.hexdigest())


class TokenCounter:
    """Counts tokens exactly as vLLM does: completions add special tokens; chat renders the template
    to text and tokenizes it without adding any."""

    def __init__(self, directory: Path, chat: bool) -> None:
        # Only tokenizers are used here, so transformers' advice that PyTorch is missing is noise.
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        from transformers import AutoTokenizer

        try:
            self.tokenizer: Any = AutoTokenizer.from_pretrained(directory)
        except Exception as error:  # transformers raises many unrelated types for an unreadable tokenizer
            raise HarnessError(f"tokenizer {directory}: cannot be loaded: {error}") from None
        self.chat = chat
        if chat:
            if not isinstance(self.tokenizer.chat_template, str):
                raise HarnessError(f"tokenizer {directory}: no single chat template, so no chat inventory")
            self.template = chat_template(self.tokenizer.chat_template)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def count(self, text: str) -> int:
        return len(self.prompt_ids(text))

    def prompt_ids(self, text: str) -> list[int]:
        """A prompt's token ids as the server computes them (for chat, the text as one user message)."""
        if not self.chat:
            return self.tokenizer(text, add_special_tokens=True)["input_ids"]
        return self.message_ids([{"role": "user", "content": text}])

    def count_messages(self, messages: list[dict[str, str]]) -> int:
        """A chat request's prompt tokens: its messages rendered with the generation prompt."""
        return len(self.message_ids(messages))

    def message_ids(self, messages: list[dict[str, str]]) -> list[int]:
        rendered = self.template.render(
            messages=messages, add_generation_prompt=True, **self.tokenizer.special_tokens_map,
        )
        return self.tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def cut(self, corpus_ids: list[int], start: int, length: int, prompt: str) -> str:
        """Text whose count is exactly `length`, from corpus tokens at `start` (wrapping around).

        Decoding a token window and re-encoding it does not always give the same tokens back, so the
        window is resized until the count is exact; a window that cannot hit it moves by one token.
        """
        overhead = self.count("")
        if length <= overhead:
            raise HarnessError(
                f"prompt {prompt}: {length} tokens leave no room for text: an empty prompt already counts {overhead}"
            )
        for shift in range(64):
            size = length - overhead
            tried: set[int] = set()
            while size > 0 and size not in tried:
                tried.add(size)
                text = self.tokenizer.decode(_wrapped(corpus_ids, start + shift, size))
                counted = self.count(text)
                if counted == length:
                    return text
                size += length - counted
        raise HarnessError(f"prompt {prompt}: no corpus text counts exactly {length} tokens near token {start}")


def chat_template(source: str) -> jinja2.Template:
    """The template compiled as transformers and vLLM compile it.

    transformers' own renderer demands jinja2>=3.1.6, which polyaxon's pin (<3.1.5) rules out, so the
    same sandboxed environment is set up here; `harness prompts verify --server` checks the counts.
    """

    def raise_exception(message: str) -> None:
        raise HarnessError(f"chat template refused the prompt: {message}")

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(source)


def _wrapped(ids: list[int], start: int, size: int) -> list[int]:
    repeats = (start % len(ids) + size) // len(ids) + 1
    return (ids * repeats)[start % len(ids) : start % len(ids) + size]
