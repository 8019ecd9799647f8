"""The field types every inventory model shares: hashes, bounded token counts, one-line names, frozen models."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
# Bounded so a typo cannot ask for a many-gigabyte build: the longest context served today is a few million
# tokens, and a frozen inventory is read whole into memory by every run.
MAX_PROMPT_TOKENS = 2**24
MAX_PROMPTS = 2**20
MAX_INVENTORY_TOKENS = 2**28
PositiveTokens = Annotated[int, Field(gt=0, le=MAX_PROMPT_TOKENS)]
InventoryName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]*[A-Za-z0-9_-][A-Za-z0-9_.-]*$")]  # not '.' or '..'
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(value: str) -> str:
    if CONTROL.search(value):
        raise ValueError("holds a newline, tab or other control character")
    return value


OneLine = Annotated[str, Field(min_length=1), AfterValidator(_one_line)]  # a name or id, printed on one line


class FrozenModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenizerIdentity(FrozenModel):
    """Which tokenizer counted a text inventory: name, pinned revision and a hash of its files."""

    name: str
    revision: str | None
    files_sha256: Sha256Hex


class ChatMessage(FrozenModel):
    """One message of a chat request as it is sent: the server renders the messages with its template."""

    role: Literal["system", "user", "assistant"]
    content: str


class SharedPrefix(FrozenModel):
    """The first `prefix_tokens` tokens of a prompt as the server tokenizes it, which another prompt of the
    inventory starts with too, named by the sha256 of their ids: equal names, equal leading tokens."""

    prefix_tokens: int = Field(gt=0, le=MAX_PROMPT_TOKENS)
    sha256: Sha256Hex
