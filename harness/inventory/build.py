"""Builders for prompt inventories: seeded token-id prompts and corpus text cut to exact token counts.

A build is a pure function of its recipe (plus, for text, the pinned corpus and tokenizer files), so the
same recipe gives byte-identical files and a committed inventory can be rebuilt to prove it is intact.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

from harness.errors import HarnessError, describe_validation_error
from harness.inventory.fields import MAX_PROMPTS, InventoryName
from harness.inventory.frozen import (
    MANIFEST_FILE,
    PROMPTS_FILE,
    Inventory,
    InventoryManifest,
    InventoryPrompt,
    assemble_inventory,
    make_prompt,
)
from harness.inventory.lengths import DrawnLengths, FixedLengths, is_distribution, parse_distribution
from harness.inventory.recipe import SALT_TOKENS, ImportRecipe, TextRecipe, TokenIdRecipe, VocabularyRange
from harness.inventory.tokenizer import TokenCounter, resolve_tokenizer
from harness.inventory.workload_recipes import ConversationLengthsRecipe, PrefixGroupRecipe
from harness.paths import output_directory, read_text

# The command-line option each recipe field comes from, so a refused field names what the user typed.
RECIPE_OPTIONS = {
    "vocabulary.low": "--vocab-low", "vocabulary.high": "--vocab-high", "vocabulary.excluded_ids": "--exclude-ids",
    "prompt_tokens": "--prompt-tokens", "output_cap_tokens": "--output-cap-tokens",
    "shared_prefix_tokens": "--shared-prefix-tokens", "salt": "--salt", "seed": "--seed", "corpus": "--corpus",
    "tokenizer": "--tokenizer", "tokenizer_revision": "--revision", "lengths": "--prompt-tokens",
    "groups": "--prefix-groups", "prompts_per_group": "--prompts-per-group", "conversations": "--conversations",
}
INTEGER = re.compile(r"^ *-?[0-9]+ *$")  # one item of a comma-separated list of integers
# What prose never holds: control characters other than whitespace, and a byte-order mark.
NOT_PROSE = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufeff]")
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
    counter = TokenCounter(directory, recipe.chat)
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


def salted(inventory: Inventory, salt: str) -> Inventory:
    """The same token-id inventory with a per-run salt, so a repeated run cannot hit a warm prefix cache."""
    recipe = inventory.manifest.recipe
    if isinstance(recipe, TextRecipe | ImportRecipe):
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
    if isinstance(recipe, ImportRecipe):
        from harness.inventory.importing import import_text

        return import_text(manifest.name, recipe).inventory
    if isinstance(recipe, PrefixGroupRecipe):
        return prefix_groups.build_prefix_group_inventory(manifest.name, recipe)
    if isinstance(recipe, ConversationLengthsRecipe):
        return prefix_groups.build_conversation_lengths_inventory(manifest.name, recipe)
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


def drawn_shapes(prompt_tokens: str, output_cap_tokens: str, count: int, seed: int) \
        -> tuple[list[int], list[int], DrawnLengths | None]:
    """The lengths `--prompt-tokens` and `--output-cap-tokens` ask for: lists as `token_shapes` reads them, or
    `count` lengths drawn from a distribution on either side (a single number on the other is fixed:N), with the
    draw that made them."""
    if not (is_distribution(prompt_tokens) or is_distribution(output_cap_tokens)):
        return *token_shapes(prompt_tokens, output_cap_tokens, count), None
    if not 1 <= count <= MAX_PROMPTS:
        raise HarnessError(f"--count: {count} prompts; an inventory holds 1 to {MAX_PROMPTS:,}")
    sides = {}
    for option, value in (("--prompt-tokens", prompt_tokens), ("--output-cap-tokens", output_cap_tokens)):
        if is_distribution(value):
            sides[option] = parse_distribution(value, option)
            continue
        numbers = int_list(value, option, minimum=1)
        if len(numbers) != 1:
            raise HarnessError(f"{option}: {value!r}: with a distribution on the other side give one length "
                               "(or a distribution), not a list")
        sides[option] = FixedLengths(tokens=numbers[0])
    plan = DrawnLengths(count=count, prompt_tokens=sides["--prompt-tokens"],
                        output_cap_tokens=sides["--output-cap-tokens"])
    lengths, caps = plan.draw(seed)
    return lengths, caps, plan


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
