"""What determines an inventory: its recipe (token ids from a vocabulary range, or corpus text cut by a
tokenizer) and the bounds every inventory keeps, so the same recipe always builds the same bytes and a typo
cannot ask for a build no machine holds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from harness.inventory.fields import (
    MAX_INVENTORY_TOKENS,
    MAX_PROMPTS,
    FrozenModel,
    OneLine,
    PositiveTokens,
    Sha256Hex,
)
from harness.inventory.lengths import DrawnLengths, LengthSource


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


# A field added after inventories were frozen is left out of the manifest when unset, so every inventory
# built before it keeps its bytes and its digest.
ABSENT_WHEN_NONE = Field(None, exclude_if=lambda value: value is None)

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
    lengths: LengthSource | None = ABSENT_WHEN_NONE

    @property
    def prompt_kind(self) -> Literal["token_ids"]:
        return "token_ids"

    @model_validator(mode="after")
    def _consistent(self) -> TokenIdRecipe:
        _check_same_length(self.prompt_tokens, self.output_cap_tokens)
        _check_total(self.prompt_tokens)
        _check_drawn(self.lengths, self.seed, self.prompt_tokens, self.output_cap_tokens)
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
    lengths: LengthSource | None = ABSENT_WHEN_NONE

    @property
    def prompt_kind(self) -> Literal["text"]:
        return "text"

    @model_validator(mode="after")
    def _consistent(self) -> TextRecipe:
        _check_same_length(self.prompt_tokens, self.output_cap_tokens)
        _check_total(self.prompt_tokens)
        _check_drawn(self.lengths, self.seed, self.prompt_tokens, self.output_cap_tokens)
        return self


class ImportRecipe(FrozenModel):
    """A text inventory imported from the user's records: rebuilt by importing the same file (pinned by its
    hash) again, with the same tokenizer, sample and seed."""

    kind: Literal["import"] = "import"
    format: Literal["openai", "sharegpt"]
    source: str = Field(min_length=1)
    source_sha256: Sha256Hex
    tokenizer: OneLine = Field(description="a local tokenizer directory or a hub id")
    tokenizer_revision: OneLine | None = None
    sample: int | None = Field(None, ge=1, le=MAX_PROMPTS)
    seed: int = Field(ge=0)
    # ShareGPT: every exchange, each a turn sent with its history. Left out of the manifest when False (the
    # first exchange of each conversation as a single request), so imports frozen before it keep their bytes.
    conversations: bool = Field(False, exclude_if=lambda value: not value)

    @property
    def prompt_kind(self) -> Literal["text"]:
        return "text"

    @model_validator(mode="after")
    def _conversations_are_sharegpts(self) -> ImportRecipe:
        if self.conversations and self.format != "sharegpt":
            raise ValueError(f"conversations are read from ShareGPT records, not {self.format}")
        return self


Recipe = Annotated[TokenIdRecipe | TextRecipe | ImportRecipe, Field(discriminator="kind")]


def _check_same_length(prompt_tokens: list[int], output_cap_tokens: list[int]) -> None:
    if len(prompt_tokens) != len(output_cap_tokens):
        raise ValueError(
            f"{len(prompt_tokens)} prompt lengths but {len(output_cap_tokens)} output caps"
        )


def _check_total(prompt_tokens: list[int]) -> None:
    if sum(prompt_tokens) > MAX_INVENTORY_TOKENS:
        raise ValueError(f"{sum(prompt_tokens):,} prompt tokens in all; an inventory holds at most "
                         f"{MAX_INVENTORY_TOKENS:,}")


def _check_drawn(lengths: LengthSource | None, seed: int, prompt_tokens: list[int], output_cap_tokens: list[int]) \
        -> None:
    """The listed lengths are the ones the recipe's distributions draw with its seed: the manifest's account of
    where its lengths came from is checked every time it is read, not taken on trust."""
    if not isinstance(lengths, DrawnLengths):
        return
    prompts, caps = lengths.draw(seed)
    if prompts != prompt_tokens or caps != output_cap_tokens:
        raise ValueError(f"prompt_tokens and output_cap_tokens are not the lengths that 'lengths' draws with seed "
                         f"{seed}")
