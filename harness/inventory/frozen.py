"""Frozen, token-counted prompt inventories: the on-disk format, loading and hashing.

Runs are comparable only if they send the same requests, so an inventory is frozen data: a directory
holding `prompts.jsonl` (one prompt per line, in a canonical byte form) and `manifest.json` (identity,
recipe, per-prompt counts and hashes). Loading re-derives every hash and count, so a single edited byte
is refused with the prompt it belongs to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field, model_validator

from harness.errors import HarnessError, describe_validation_error
from harness.inventory.fields import (
    ChatMessage,
    FrozenModel,
    InventoryName,
    PositiveTokens,
    Sha256Hex,
    SharedPrefix,
    TokenizerIdentity,
)
from harness.inventory.recipe import (
    ABSENT_WHEN_NONE,
    ImportRecipe,
    Recipe,
    TextRecipe,
    VocabularyRange,
)
from harness.inventory.recipe import (
    TokenIdRecipe as TokenIdRecipe,  # re-exported: callers build inventories from here
)
from harness.inventory.workload_recipes import ConversationLengthsRecipe, ConversationRecipe, PrefixGroupRecipe

# Every recipe a manifest may hold: the plain ones and those with structure a prefix cache can use.
AnyRecipe = Annotated[Recipe | PrefixGroupRecipe | ConversationRecipe | ConversationLengthsRecipe,
                      Field(discriminator="kind")]

SCHEMA_VERSION = 1
PROMPTS_FILE = "prompts.jsonl"
MANIFEST_FILE = "manifest.json"
BUNDLED_DIR = "prompts"  # where a checkout keeps the frozen inventories


def canonical_json(value: Any) -> str:
    """The one byte form used for lines and hashes, so equal content always hashes equally."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class InventoryPrompt(FrozenModel):
    """One request's input: token ids sent as-is, or text (optionally as one chat user message)."""

    prompt_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    prompt_tokens: PositiveTokens
    output_cap_tokens: PositiveTokens
    token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    text: str | None = None
    chat: bool = False
    # A recorded chat request of several messages (a system prompt, earlier turns): sent as recorded.
    messages: list[ChatMessage] | None = ABSENT_WHEN_NONE
    # A conversation's turn: which conversation, and 1 for its first turn.
    conversation_id: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = ABSENT_WHEN_NONE
    turn: Annotated[int | None, Field(ge=1)] = ABSENT_WHEN_NONE
    # An imported text prompt's leading tokens that other prompts start with too, shortest first: where the
    # prefix cache can reuse them (a token-id prompt's ids show it themselves).
    shared_prefixes: list[SharedPrefix] | None = ABSENT_WHEN_NONE
    sha256: Sha256Hex

    @model_validator(mode="after")
    def _consistent(self) -> InventoryPrompt:
        held = [name for name in ("token_ids", "text", "messages") if getattr(self, name) is not None]
        if len(held) != 1:
            raise ValueError(f"prompt {self.prompt_id} must hold exactly one of token_ids, text and messages")
        if self.messages is not None and not (self.chat and self.messages):
            raise ValueError(f"prompt {self.prompt_id}: messages are a chat prompt (chat true, at least one)")
        if self.token_ids is not None and len(self.token_ids) != self.prompt_tokens:
            raise ValueError(
                f"prompt {self.prompt_id}: prompt_tokens is {self.prompt_tokens} but token_ids holds "
                f"{len(self.token_ids)} ids"
            )
        if self.chat and self.token_ids is not None:
            raise ValueError(f"prompt {self.prompt_id}: chat needs text or messages, not token_ids")
        if (self.conversation_id is None) != (self.turn is None):
            raise ValueError(f"prompt {self.prompt_id}: a conversation's turn needs both conversation_id and turn")
        return self

    @model_validator(mode="after")
    def _prefixes_inside(self) -> InventoryPrompt:
        if self.shared_prefixes is None:
            return self
        lengths = [prefix.prefix_tokens for prefix in self.shared_prefixes]
        if self.token_ids is not None or not lengths:
            raise ValueError(f"prompt {self.prompt_id}: shared_prefixes describe a text prompt, and hold at least one")
        if lengths != sorted(set(lengths)) or lengths[-1] > self.prompt_tokens:
            raise ValueError(f"prompt {self.prompt_id}: shared_prefixes must grow strictly and end within its "
                             f"{self.prompt_tokens} prompt tokens, not {lengths}")
        return self

    def chat_messages(self) -> list[dict[str, str]]:
        """The chat messages a chat prompt is sent as: its recorded messages, or its text as one user turn."""
        if self.messages is not None:
            return [message.model_dump() for message in self.messages]
        if not self.chat or self.text is None:
            raise HarnessError(f"prompt {self.prompt_id} is not a chat prompt")
        return [{"role": "user", "content": self.text}]

    def content_sha256(self) -> str:
        """The hash of everything but the stored hash itself."""
        return sha256_hex(canonical_json(self.model_dump(mode="json", exclude={"sha256"})))

    def line(self) -> str:
        return canonical_json(self.model_dump(mode="json"))



def make_prompt(
    prompt_id: str,
    prompt_tokens: int,
    output_cap_tokens: int,
    *,
    token_ids: list[int] | None = None,
    text: str | None = None,
    chat: bool = False,
    messages: list[ChatMessage] | None = None,
    conversation_id: str | None = None,
    turn: int | None = None,
    shared_prefixes: list[SharedPrefix] | None = None,
) -> InventoryPrompt:
    """A prompt with its hash filled in (the only way builders should create one)."""
    draft = InventoryPrompt(prompt_id=prompt_id, prompt_tokens=prompt_tokens, output_cap_tokens=output_cap_tokens,
                            token_ids=token_ids, text=text, chat=chat or messages is not None, messages=messages,
                            conversation_id=conversation_id, turn=turn, shared_prefixes=shared_prefixes,
                            sha256="0" * 64)
    return draft.model_copy(update={"sha256": draft.content_sha256()})


class ManifestEntry(FrozenModel):
    prompt_id: str
    prompt_tokens: PositiveTokens
    output_cap_tokens: PositiveTokens
    sha256: Sha256Hex


class InventoryManifest(FrozenModel):
    schema_version: Literal[1]
    name: InventoryName
    kind: Literal["token_ids", "text"]
    inventory_sha256: Sha256Hex
    tokenizer: TokenizerIdentity | None
    recipe: AnyRecipe
    prompt_count: int = Field(gt=0)
    prompt_tokens_total: int
    output_cap_tokens_total: int
    prompts: list[ManifestEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> InventoryManifest:
        if self.recipe.prompt_kind != self.kind:
            raise ValueError(f"kind {self.kind} but a {self.recipe.kind} recipe, which makes {self.recipe.prompt_kind}")
        if (self.tokenizer is None) != (self.kind == "token_ids"):
            raise ValueError("a text inventory names its tokenizer; a token-id inventory has none")
        checks = {
            "prompt_count": (self.prompt_count, len(self.prompts)),
            "prompt_tokens_total": (self.prompt_tokens_total, sum(p.prompt_tokens for p in self.prompts)),
            "output_cap_tokens_total": (
                self.output_cap_tokens_total,
                sum(p.output_cap_tokens for p in self.prompts),
            ),
        }
        for field, (stated, counted) in checks.items():
            if stated != counted:
                raise ValueError(f"{field} is {stated} but the prompt list adds up to {counted}")
        ids = [p.prompt_id for p in self.prompts]
        if len(set(ids)) != len(ids):
            raise ValueError("prompt ids repeat")
        return self

    @property
    def seed(self) -> int:
        return self.recipe.seed

    @property
    def vocabulary(self) -> VocabularyRange | None:
        return None if isinstance(self.recipe, TextRecipe | ImportRecipe) else self.recipe.vocabulary

    def content_sha256(self) -> str:
        return sha256_hex(canonical_json(self.model_dump(mode="json", exclude={"inventory_sha256"})))

    def text(self) -> str:
        return self.model_dump_json(indent=2) + "\n"


@dataclass(frozen=True)
class Inventory:
    manifest: InventoryManifest
    prompts: list[InventoryPrompt]

    @property
    def digest(self) -> str:
        return self.manifest.inventory_sha256


def assemble_inventory(
    name: str, recipe: AnyRecipe, tokenizer: TokenizerIdentity | None,
    prompts: list[InventoryPrompt],
) -> Inventory:
    """Wrap built prompts in a manifest whose digest covers every prompt's hash and the recipe."""
    fields: dict[str, Any] = dict(
        schema_version=SCHEMA_VERSION,
        name=name,
        kind=recipe.prompt_kind,
        inventory_sha256="0" * 64,
        tokenizer=tokenizer,
        recipe=recipe,
        prompt_count=len(prompts),
        prompt_tokens_total=sum(p.prompt_tokens for p in prompts),
        output_cap_tokens_total=sum(p.output_cap_tokens for p in prompts),
        prompts=[ManifestEntry(**p.model_dump(include=set(ManifestEntry.model_fields))) for p in prompts],
    )
    try:
        draft = InventoryManifest(**fields)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, f"inventory {name!r}")) from None
    manifest = draft.model_copy(update={"inventory_sha256": draft.content_sha256()})
    return Inventory(manifest=manifest, prompts=prompts)


def write_inventory(inventory: Inventory, directory: Path) -> Path:
    """Write the two files in their canonical byte form (re-loading them is the test of the writer)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = "".join(prompt.line() + "\n" for prompt in inventory.prompts)
    (directory / PROMPTS_FILE).write_text(lines, encoding="utf-8", newline="\n")
    (directory / MANIFEST_FILE).write_text(inventory.manifest.text(), encoding="utf-8", newline="\n")
    return directory


def load_inventory(path: Path) -> Inventory:
    """Read and fully re-check an inventory; any problem is a HarnessError naming file and line/prompt."""
    path = resolve_inventory(path)
    manifest = _load_manifest(path / MANIFEST_FILE)
    prompts = _load_prompts(path / PROMPTS_FILE, manifest)
    return Inventory(manifest=manifest, prompts=prompts)


def resolve_inventory(path: Path) -> Path:
    """`prompts/<name>` as given when it exists here, else the inventory of that name that travels with the
    harness: a job's command names the same inventory whether the harness came in an image, a wheel, an
    upload or a git checkout, and whatever its working directory. Such a name never holds '..': it
    addresses the prompts folder, not a way out of it."""
    path = Path(path)
    if path.is_absolute() or path.parts[:1] != (BUNDLED_DIR,):
        return path
    if ".." in path.parts:
        raise HarnessError(f"{path}: '..' in an inventory addressed as {BUNDLED_DIR}/<name>; give the "
                           f"inventory's own name, or its folder's path without {BUNDLED_DIR}/ in front")
    if path.exists():
        return path
    package = Path(__file__).resolve().parents[1]  # harness/, where an install keeps bundled_prompts
    for root in (package / "bundled_prompts", package.parent / BUNDLED_DIR):  # installed; a checkout
        if root.joinpath(*path.parts[1:]).is_dir():
            return root.joinpath(*path.parts[1:])
    return path


def _read_text(file: Path) -> str:
    """The file's exact text: line endings are part of the frozen bytes, so none is translated."""
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise HarnessError(f"{file}: no such file (an inventory needs {PROMPTS_FILE} and {MANIFEST_FILE})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise HarnessError(f"{file}: unreadable: {error}") from None
    if "\r" in text:
        line = text.count("\n", 0, text.index("\r")) + 1
        raise HarnessError(f"{file} line {line}: holds a carriage return (a CRLF line ending?); the file was "
                           "changed since it was built, so it is not the frozen inventory")
    return text


def _load_manifest(file: Path) -> InventoryManifest:
    raw = _read_text(file)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise HarnessError(f"{file}: malformed JSON at line {error.lineno}: {error.msg}") from None
    except RecursionError:  # nested deeper than any manifest: not one
        raise HarnessError(f"{file}: malformed JSON: nested too deep") from None
    try:
        manifest = InventoryManifest.model_validate(data)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, file)) from None
    if manifest.content_sha256() != manifest.inventory_sha256:
        raise HarnessError(f"{file}: inventory_sha256 does not match the manifest's content (it was edited)")
    if raw != manifest.text():
        raise HarnessError(f"{file}: not in canonical form (it was edited by hand)")
    return manifest


def _load_prompts(file: Path, manifest: InventoryManifest) -> list[InventoryPrompt]:
    lines = _read_text(file).split("\n")
    if lines[-1] != "":
        raise HarnessError(f"{file}: the last line does not end with a newline (truncated?)")
    lines.pop()
    if len(lines) != manifest.prompt_count:
        raise HarnessError(f"{file}: {len(lines)} lines but the manifest lists {manifest.prompt_count} prompts")
    prompts: list[InventoryPrompt] = []
    modified: list[str] = []
    for number, (line, entry) in enumerate(zip(lines, manifest.prompts, strict=True), start=1):
        where = f"{file} line {number} (prompt {entry.prompt_id})"
        prompt = _parse_prompt_line(line, where)
        problem = _disagreement(prompt, entry, manifest, line)
        if problem == "modified":
            modified.append(entry.prompt_id)
        elif problem:
            raise HarnessError(f"{where}: {problem}")
        prompts.append(prompt)
    if modified:
        shown = ", ".join(modified[:10]) + (f" and {len(modified) - 10} more" if len(modified) > 10 else "")
        raise HarnessError(f"{file}: modified since it was built (sha256 mismatch): prompt {shown}")
    return prompts


def _parse_prompt_line(line: str, where: str) -> InventoryPrompt:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as error:
        raise HarnessError(f"{where}: malformed JSON at column {error.colno}: {error.msg}") from None
    except RecursionError:
        raise HarnessError(f"{where}: malformed JSON: nested too deep") from None
    try:
        return InventoryPrompt.model_validate(data)
    except pydantic.ValidationError as error:
        raise HarnessError(describe_validation_error(error, where)) from None


def _disagreement(prompt: InventoryPrompt, entry: ManifestEntry, manifest: InventoryManifest, line: str) -> str:
    """What is wrong with one line given its manifest entry: '' if nothing, 'modified' for a hash mismatch."""
    if prompt.prompt_id != entry.prompt_id:
        return f"prompt_id {prompt.prompt_id!r} where the manifest lists {entry.prompt_id!r}"
    if (prompt.prompt_tokens, prompt.output_cap_tokens) != (entry.prompt_tokens, entry.output_cap_tokens):
        return (
            f"prompt_tokens/output_cap_tokens {prompt.prompt_tokens}/{prompt.output_cap_tokens} disagree "
            f"with the manifest's {entry.prompt_tokens}/{entry.output_cap_tokens}"
        )
    if (prompt.token_ids is None) != (manifest.kind == "text"):
        return f"does not hold the {manifest.kind} the manifest declares"
    if prompt.content_sha256() != prompt.sha256 or prompt.sha256 != entry.sha256 or line != prompt.line():
        return "modified"
    vocabulary = manifest.vocabulary
    if vocabulary is not None and prompt.token_ids is not None:
        outside = vocabulary.disallowed(prompt.token_ids)
        if outside:
            return f"token ids outside the manifest's vocabulary range: {outside[:5]}"
    return ""
