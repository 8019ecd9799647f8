"""Recipes of token-id inventories with structure a prefix cache can use: groups of prompts sharing a prefix,
and conversations whose every turn repeats the turns before it (synthetic, or the lengths of recorded ones).

They sit beside `recipe.py`'s plain recipes and keep their bounds; each one rebuilds byte-identically.
"""

from __future__ import annotations

import itertools
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from harness.inventory.fields import (
    MAX_INVENTORY_TOKENS,
    MAX_PROMPT_TOKENS,
    MAX_PROMPTS,
    FrozenModel,
    OneLine,
    PositiveTokens,
)
from harness.inventory.lengths import ImportedLengths
from harness.inventory.recipe import SALT_TOKENS, VocabularyRange, _check_same_length, _check_total


class PrefixGroupRecipe(FrozenModel):
    """`groups` × `prompts_per_group` prompts, group-major: prompt i belongs to group i // prompts_per_group,
    and the prompts of a group share their first `shared_prefix_tokens` tokens. A salt makes every prompt's
    first tokens its own, so nothing is shared."""

    kind: Literal["prefix_groups"] = "prefix_groups"
    vocabulary: VocabularyRange
    groups: int = Field(ge=1, le=MAX_PROMPTS)
    prompts_per_group: int = Field(ge=1, le=MAX_PROMPTS)
    shared_prefix_tokens: int = Field(gt=0, le=MAX_PROMPT_TOKENS)
    prompt_tokens: list[PositiveTokens] = Field(min_length=1, max_length=MAX_PROMPTS)
    output_cap_tokens: list[PositiveTokens] = Field(min_length=1, max_length=MAX_PROMPTS)
    salt: OneLine | None = None
    seed: int = Field(ge=0)

    @property
    def prompt_kind(self) -> Literal["token_ids"]:
        return "token_ids"

    @model_validator(mode="after")
    def _consistent(self) -> PrefixGroupRecipe:
        _check_same_length(self.prompt_tokens, self.output_cap_tokens)
        _check_total(self.prompt_tokens)
        if len(self.prompt_tokens) != self.groups * self.prompts_per_group:
            raise ValueError(f"{len(self.prompt_tokens)} prompt lengths for {self.groups} groups × "
                             f"{self.prompts_per_group} prompts")
        if self.shared_prefix_tokens >= min(self.prompt_tokens):
            raise ValueError(f"shared_prefix_tokens {self.shared_prefix_tokens} must be below the shortest prompt "
                             f"({min(self.prompt_tokens)} tokens)")
        if self.salt is not None and min(self.prompt_tokens) < SALT_TOKENS:
            raise ValueError(f"a salted inventory needs prompts of at least {SALT_TOKENS} tokens")
        return self

    def group_of(self, index: int) -> int:
        return index // self.prompts_per_group


class TokenRange(FrozenModel):
    """A whole number drawn uniformly from [low, high]; low == high is a fixed one."""

    low: int = Field(ge=1, le=MAX_PROMPT_TOKENS)
    high: int = Field(ge=1, le=MAX_PROMPT_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> TokenRange:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")
        return self

    def draw(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.low, self.high + 1))


class ConversationRecipe(FrozenModel):
    """Synthetic conversations: each has a drawn number of turns, each turn a drawn user message, a drawn
    recorded reply and an output cap. Turn k's prompt is the turns before it, replies included, then its
    own user message: the inventory holds every turn's whole prompt, so each is frozen and token-exact."""

    kind: Literal["conversations"] = "conversations"
    vocabulary: VocabularyRange
    conversations: int = Field(ge=1, le=MAX_PROMPTS)
    turns: TokenRange = Field(description="turns per conversation")
    user_tokens: TokenRange
    assistant_tokens: TokenRange = Field(description="the recorded reply each later turn's history repeats")
    output_cap_tokens: PositiveTokens
    salt: OneLine | None = Field(None, description="makes each conversation's first tokens its own per salt")
    seed: int = Field(ge=0)

    @property
    def prompt_kind(self) -> Literal["token_ids"]:
        return "token_ids"

    @model_validator(mode="after")
    def _bounded(self) -> ConversationRecipe:
        longest = self.turns.high * (self.user_tokens.high + self.assistant_tokens.high)
        if self.conversations * self.turns.high > MAX_PROMPTS:
            raise ValueError(f"up to {self.conversations * self.turns.high:,} turns; an inventory holds at most "
                             f"{MAX_PROMPTS:,} prompts")
        if longest > MAX_PROMPT_TOKENS or self.conversations * self.turns.high * longest > MAX_INVENTORY_TOKENS:
            raise ValueError(f"turns of up to {longest:,} tokens in {self.conversations} conversations: more than "
                             f"an inventory holds ({MAX_INVENTORY_TOKENS:,} tokens)")
        if self.salt is not None and self.user_tokens.low < SALT_TOKENS:
            raise ValueError(f"a salted inventory needs user messages of at least {SALT_TOKENS} tokens")
        return self


class TurnLengths(FrozenModel):
    """One recorded turn as the server counted it: its whole prompt (the history included) and its reply."""

    prompt_tokens: PositiveTokens
    output_cap_tokens: PositiveTokens


class ConversationLengthsRecipe(FrozenModel):
    """Recorded conversations kept as their lengths only (`harness prompts import --lengths-only`): turn k's
    prompt is turn k-1's prompt, then drawn ids up to turn k's count. The drawn ids stand for the recorded reply,
    the template's tokens and the new question, so every turn repeats the one before it exactly, as the recorded
    turns do, and none of the user's text is kept."""

    kind: Literal["conversation_lengths"] = "conversation_lengths"
    vocabulary: VocabularyRange
    conversations: list[list[TurnLengths]] = Field(min_length=1, max_length=MAX_PROMPTS)
    seed: int = Field(ge=0)
    lengths: ImportedLengths

    @property
    def prompt_kind(self) -> Literal["token_ids"]:
        return "token_ids"

    @model_validator(mode="after")
    def _growing(self) -> ConversationLengthsRecipe:
        turns = [turn for conversation in self.conversations for turn in conversation]
        if not all(self.conversations) or len(turns) > MAX_PROMPTS:
            raise ValueError(f"{len(turns):,} turns in {len(self.conversations):,} conversations; each holds at "
                             f"least one, and an inventory at most {MAX_PROMPTS:,}")
        _check_total([turn.prompt_tokens for turn in turns])
        for index, conversation in enumerate(self.conversations):
            counts = [turn.prompt_tokens for turn in conversation]
            if any(later <= earlier for earlier, later in itertools.pairwise(counts)):
                raise ValueError(f"conversation {index}: turn prompts of {counts} tokens; each turn's prompt holds "
                                 "the turn before it, so each is longer")
        return self
