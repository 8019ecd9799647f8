"""What determines an inventory: its recipe (token ids from a vocabulary range, or corpus text cut by a
tokenizer) and the bounds every inventory keeps, so the same recipe always builds the same bytes and a typo
cannot ask for a build no machine holds.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

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


class VocabularyRange(FrozenModel):
    """Token ids a token-id inventory may use: [low, high) minus ids that would act as control tokens."""

    low: int = Field(ge=0)
    # Bounded so a typo cannot ask for a multi-gigabyte id table; real vocabularies stay far below.
    high: int = Field(gt=0, le=2**24, description="one past the last allowed id")
    excluded_ids: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> VocabularyRange:
        if self.low >= self.high:
            raise ValueError(f"low {self.low} must be below high {self.high}")
        if self.excluded_ids != sorted(set(self.excluded_ids)):
            raise ValueError("excluded_ids must be sorted and unique")
        outside = [i for i in self.excluded_ids if not self.low <= i < self.high]
        if outside:
            raise ValueError(f"excluded_ids outside [{self.low}, {self.high}): {outside[:5]}")
        if self.high - self.low - len(self.excluded_ids) < 2:
            raise ValueError("fewer than 2 allowed token ids")
        return self

    def disallowed(self, token_ids: list[int]) -> list[int]:
        excluded = set(self.excluded_ids)
        return [t for t in token_ids if not self.low <= t < self.high or t in excluded]


# Leading tokens a salt overwrites: enough that two prompts almost never share them, even with a small
# vocabulary, and a prefix cache then misses from the first block on.
SALT_TOKENS = 8


class TokenIdRecipe(FrozenModel):
    """Everything that determines a token-id inventory, so it rebuilds byte-identically."""

    kind: Literal["token_ids"] = "token_ids"
    vocabulary: VocabularyRange
    prompt_tokens: list[PositiveTokens] = Field(min_length=1, max_length=MAX_PROMPTS)
    output_cap_tokens: list[PositiveTokens] = Field(min_length=1, max_length=MAX_PROMPTS)
    shared_prefix_tokens: int = Field(default=0, ge=0)
    salt: OneLine | None = None
    seed: int = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> TokenIdRecipe:
        _check_same_length(self.prompt_tokens, self.output_cap_tokens)
        _check_total(self.prompt_tokens)
        if self.shared_prefix_tokens >= min(self.prompt_tokens):
            raise ValueError(
                f"shared_prefix_tokens {self.shared_prefix_tokens} must be below the shortest prompt "
                f"({min(self.prompt_tokens)} tokens)"
            )
        if self.salt is not None and min(self.prompt_tokens) < SALT_TOKENS:
            raise ValueError(f"a salted inventory needs prompts of at least {SALT_TOKENS} tokens")
        return self


class TextRecipe(FrozenModel):
    """Everything that determines a text inventory; the corpus is pinned by its hash."""

    kind: Literal["text"] = "text"
    corpus: str = Field(min_length=1)
    corpus_sha256: Sha256Hex
    tokenizer: OneLine = Field(description="a local tokenizer directory or a hub id")
    tokenizer_revision: OneLine | None = None
    chat: bool
    prompt_tokens: list[PositiveTokens] = Field(min_length=1, max_length=MAX_PROMPTS)
    output_cap_tokens: list[PositiveTokens] = Field(min_length=1, max_length=MAX_PROMPTS)
    seed: int = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> TextRecipe:
        _check_same_length(self.prompt_tokens, self.output_cap_tokens)
        _check_total(self.prompt_tokens)
        return self


Recipe = Annotated[TokenIdRecipe | TextRecipe, Field(discriminator="kind")]


def _check_same_length(prompt_tokens: list[int], output_cap_tokens: list[int]) -> None:
    if len(prompt_tokens) != len(output_cap_tokens):
        raise ValueError(
            f"{len(prompt_tokens)} prompt lengths but {len(output_cap_tokens)} output caps"
        )


def _check_total(prompt_tokens: list[int]) -> None:
    if sum(prompt_tokens) > MAX_INVENTORY_TOKENS:
        raise ValueError(f"{sum(prompt_tokens):,} prompt tokens in all; an inventory holds at most "
                         f"{MAX_INVENTORY_TOKENS:,}")
