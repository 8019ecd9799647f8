"""Builders for prompt inventories: seeded token-id prompts and corpus text cut to exact token counts.

A build is a pure function of its recipe (plus, for text, the pinned corpus and tokenizer files), so the
same recipe gives byte-identical files and a committed inventory can be rebuilt to prove it is intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import numpy as np
import pydantic

from harness.errors import HarnessError, describe_validation_error
from harness.inventory.frozen import (
    MANIFEST_FILE,
    PROMPTS_FILE,
    Inventory,
    InventoryManifest,
    InventoryPrompt,
    TokenizerIdentity,
    assemble_inventory,
    make_prompt,
)
from harness.inventory.recipe import (
    MAX_PROMPTS,
    SALT_TOKENS,
    InventoryName,
    TextRecipe,
    TokenIdRecipe,
    VocabularyRange,
)
from harness.inventory.workload_recipes import PrefixGroupRecipe
from harness.paths import output_directory, read_text

# The command-line option each recipe field comes from, so a refused field names what the user typed.
RECIPE_OPTIONS = {
    "vocabulary.low": "--vocab-low", "vocabulary.high": "--vocab-high", "vocabulary.excluded_ids": "--exclude-ids",
    "prompt_tokens": "--prompt-tokens", "output_cap_tokens": "--output-cap-tokens",
    "shared_prefix_tokens": "--shared-prefix-tokens", "salt": "--salt", "seed": "--seed", "corpus": "--corpus",
    "tokenizer": "--tokenizer", "tokenizer_revision": "--revision",
    "groups": "--prefix-groups", "prompts_per_group": "--prompts-per-group", "conversations": "--conversations",
}
INTEGER = re.compile(r"^ *-?[0-9]+ *$")  # one item of a comma-separated list of integers
# What prose never holds: control characters other than whitespace, and a byte-order mark.
NOT_PROSE = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufeff]")
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


def prompt_id(index: int) -> str:
    return f"p{index:04d}"


def build_token_id_inventory(name: str, recipe: TokenIdRecipe) -> Inventory:
    """Seeded random ids from the allowed range; an optional shared prefix; an optional per-run salt."""
    allowed = allowed_ids(recipe.vocabulary)
    rng = np.random.default_rng(recipe.seed)
    prefix = allowed[rng.integers(0, allowed.size, size=recipe.shared_prefix_tokens)]
    prompts = []
    for index, (length, cap) in enumerate(zip(recipe.prompt_tokens, recipe.output_cap_tokens, strict=True)):
        body = allowed[rng.integers(0, allowed.size, size=length - recipe.shared_prefix_tokens)]
        ids = np.concatenate([prefix, body])
        if recipe.salt is not None:
            ids[:SALT_TOKENS] = salt_ids(recipe.salt, prompt_id(index), allowed)
        prompts.append(make_prompt(prompt_id(index), length, cap, token_ids=[int(t) for t in ids]))
    return assemble_inventory(name, recipe, None, prompts)


def allowed_ids(vocabulary: VocabularyRange) -> np.ndarray:
    every = np.arange(vocabulary.low, vocabulary.high, dtype=np.int64)
    return np.setdiff1d(every, np.asarray(vocabulary.excluded_ids, dtype=np.int64), assume_unique=True)


def salt_ids(salt: str, prompt: str, allowed: np.ndarray) -> list[int]:
    """The salt's hash written in base len(allowed): distinct per prompt and per salt, with no RNG state."""
    number = int.from_bytes(hashlib.sha256(f"{salt}\x00{prompt}".encode()).digest(), "big")
    digits = []
    for _ in range(SALT_TOKENS):
        number, digit = divmod(number, allowed.size)
        digits.append(int(allowed[digit]))
    return digits


def corpus_sha256(corpus: Path) -> str:
    try:
        return hashlib.sha256(corpus.read_bytes()).hexdigest()
    except OSError as error:
        raise HarnessError(f"corpus {corpus}: unreadable: {error}") from None


def read_corpus(corpus: Path, option: str = "--corpus") -> str:
    """A corpus's text, refused when it is not prose to cut prompts from: not UTF-8, a binary file that happens
    to decode (control characters, a byte-order mark), or a JSON dataset whose keys would be cut into prompts."""
    text = read_text(corpus, option)
    odd = NOT_PROSE.search(text)
    if odd is not None:
        shown = "a byte-order mark" if odd.group() == "\ufeff" else f"control character {odd.group()!r}"
        raise HarnessError(f"{option} {corpus}: {shown} at character {odd.start()}; a corpus is plain text, not a "
                           "binary or re-encoded file")
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        parsed = json.loads(first)
    except ValueError:
        return text
    except RecursionError:  # brackets nested past any prose
        parsed = []
    if isinstance(parsed, dict | list):
        keys = f" with keys {', '.join(repr(key) for key in list(parsed)[:5])}" if isinstance(parsed, dict) else ""
        raise HarnessError(f"{option} {corpus}: JSON{keys}, not plain text; give the text itself, as a .txt file")
    return text


def build_text_inventory(name: str, recipe: TextRecipe) -> Inventory:
    """Corpus windows cut so the server's count (templated, if chat) is exactly each prompt length."""
    corpus = Path(recipe.corpus)
    text = read_corpus(corpus, "corpus")
    if corpus_sha256(corpus) != recipe.corpus_sha256:
        raise HarnessError(f"corpus {corpus}: its sha256 differs from the recipe's corpus_sha256")
    directory, identity = resolve_tokenizer(recipe.tokenizer, recipe.tokenizer_revision)
    counter = _TokenCounter(directory, recipe.chat)
    corpus_ids = counter.encode(text)
    if len(corpus_ids) < 2:
        raise HarnessError(f"corpus {corpus}: too little text to cut prompts from")
    rng = np.random.default_rng(recipe.seed)
    prompts: list[InventoryPrompt] = []
    for index, (length, cap) in enumerate(zip(recipe.prompt_tokens, recipe.output_cap_tokens, strict=True)):
        start = int(rng.integers(0, len(corpus_ids)))
        text = counter.cut(corpus_ids, start, length, prompt_id(index))
        prompts.append(make_prompt(prompt_id(index), length, cap, text=text, chat=recipe.chat))
    return assemble_inventory(name, recipe, identity, prompts)


def check_vocabulary(vocabulary: dict[str, Any], tokenizer: str, revision: str | None) -> list[str]:
    """Token ids the tokenizer does not have cannot be served: refused. Special ids inside the range are
    legal but act as control tokens: returned as warnings."""
    directory, _ = resolve_tokenizer(tokenizer, revision)
    loaded = _TokenCounter(directory, chat=False).tokenizer
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


class _TokenCounter:
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
            self.template = _chat_template(self.tokenizer.chat_template)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def count(self, text: str) -> int:
        if not self.chat:
            return len(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        rendered = self.template.render(
            messages=[{"role": "user", "content": text}],
            add_generation_prompt=True,
            **self.tokenizer.special_tokens_map,
        )
        return len(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])

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


def _chat_template(source: str) -> jinja2.Template:
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


def salted(inventory: Inventory, salt: str) -> Inventory:
    """The same token-id inventory with a per-run salt, so a repeated run cannot hit a warm prefix cache."""
    recipe = inventory.manifest.recipe
    if isinstance(recipe, TextRecipe):
        raise HarnessError(f"inventory {inventory.manifest.name}: only token-id inventories can be salted")
    try:
        again = type(recipe).model_validate({**recipe.model_dump(), "salt": salt})
    except pydantic.ValidationError as error:
        raise HarnessError(recipe_error(error, "token-id recipe")) from None
    return rebuild(inventory.manifest.model_copy(update={"recipe": again}))


def rebuild(manifest: InventoryManifest) -> Inventory:
    """Build again from a manifest's own recipe (the proof that frozen data matches its recipe)."""
    from harness.inventory import prefix_groups  # it builds on this module's id tables

    recipe = manifest.recipe
    if isinstance(recipe, TokenIdRecipe):
        return build_token_id_inventory(manifest.name, recipe)
    if isinstance(recipe, TextRecipe):
        return build_text_inventory(manifest.name, recipe)
    if isinstance(recipe, PrefixGroupRecipe):
        return prefix_groups.build_prefix_group_inventory(manifest.name, recipe)
    return prefix_groups.build_conversation_inventory(manifest.name, recipe)


def token_shapes(prompt_tokens: str, output_cap_tokens: str, count: int) -> tuple[list[int], list[int]]:
    """Parse '512,1024' style lists; one output cap applies to all; every length repeats `count` times."""
    lengths = int_list(prompt_tokens, "--prompt-tokens", minimum=1)
    caps = int_list(output_cap_tokens, "--output-cap-tokens", minimum=1)
    if len(caps) == 1:
        caps = caps * len(lengths)
    if len(caps) != len(lengths):
        raise HarnessError(f"--output-cap-tokens: {len(caps)} values for {len(lengths)} prompt lengths")
    if count < 1:
        raise HarnessError(f"--count: {count} is not a positive number of prompts")
    if count * len(lengths) > MAX_PROMPTS:
        raise HarnessError(f"--count: {count} × {len(lengths)} prompt lengths is {count * len(lengths):,} prompts; "
                           f"an inventory holds at most {MAX_PROMPTS:,}")
    return (
        [n for n in lengths for _ in range(count)],
        [c for c in caps for _ in range(count)],
    )


def int_list(value: str, option: str, *, minimum: int) -> list[int]:
    """A comma-separated command-line list of integers; empty means none. Each is ASCII digits, as the
    integer options take them: Python's int() would also read '１２' and '1_000'."""
    if not value.strip():
        return []
    if not all(INTEGER.match(part) for part in value.split(",")):
        raise HarnessError(f"{option}: {value!r} is not a comma-separated list of integers")
    numbers = [int(part) for part in value.split(",")]
    if any(n < minimum for n in numbers):
        raise HarnessError(f"{option}: {value!r} holds a value below {minimum}")
    return numbers


def check_rebuilds(inventory: Inventory) -> None:
    """Refuse an inventory that its own recipe no longer reproduces (data and recipe have drifted)."""
    again = rebuild(inventory.manifest)
    if again.digest != inventory.digest:
        differing = [a.prompt_id for a, b in zip(inventory.prompts, again.prompts, strict=True) if a.sha256 != b.sha256]
        raise HarnessError(
            f"inventory {inventory.manifest.name}: its recipe rebuilds a different inventory "
            f"(prompts differing: {', '.join(differing[:10]) or 'none; the manifest differs'})"
        )


def token_id_recipe(**fields: Any) -> TokenIdRecipe:
    """A recipe from command-line values, with bad values reported as one line."""
    try:
        return TokenIdRecipe(**fields)
    except pydantic.ValidationError as error:
        raise HarnessError(recipe_error(error, "token-id recipe")) from None


def text_recipe(corpus: Path, **fields: Any) -> TextRecipe:
    """A recipe from command-line values; the corpus is checked and pinned by hashing it now."""
    read_corpus(corpus)
    try:
        return TextRecipe(corpus=str(corpus), corpus_sha256=corpus_sha256(corpus), **fields)
    except pydantic.ValidationError as error:
        raise HarnessError(recipe_error(error, "text recipe")) from None


def recipe_error(error: pydantic.ValidationError, recipe: str) -> str:
    """The refused field in one line, led by the option it came from: '--vocab-high: token-id recipe: field
    'vocabulary.high': ...'."""
    field = ".".join(str(part) for part in error.errors()[0]["loc"] if not isinstance(part, int))
    described = describe_validation_error(error, recipe)
    return f"{RECIPE_OPTIONS[field]}: {described}" if field in RECIPE_OPTIONS else described


def inventory_name(name: str | None, out: Path) -> str:
    """The inventory's name: `--name`, else OUT's folder name; checked before anything is built."""
    given = name if name is not None else out.name
    try:
        return pydantic.TypeAdapter(InventoryName).validate_python(given)
    except pydantic.ValidationError:
        reason = "not an inventory name (letters, digits, '_', '-' and '.', not only dots)"
        if name is not None:
            raise HarnessError(f"--name {name!r}: {reason}") from None
        raise HarnessError(f"inventory {given!r}: field 'name': {reason}; OUT's folder name is used, give --name") \
            from None


def inventory_directory(out: Path) -> Path:
    """OUT as a folder the inventory can be written in, and not one already holding an inventory: a frozen
    inventory is never overwritten by a new build."""
    output_directory(out, "OUT")
    held = [name for name in (MANIFEST_FILE, PROMPTS_FILE) if (out / name).exists()]
    if held:
        raise HarnessError(f"OUT {out}: already holds an inventory ({', '.join(held)}); give a new directory")
    return out
