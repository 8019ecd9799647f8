"""Builders of the token-id inventories a prefix cache can reuse: groups sharing a prefix, and conversations.

`Conversation` is the form any source of conversations fills (the synthetic recipe here, or an import of
recorded ones, tokenized first): `conversation_prompts` turns it into frozen prompts, each turn holding the
whole history it is sent with.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pydantic
from pydantic import Field

from harness.errors import HarnessError
from harness.inventory.build import allowed_ids, prompt_id, recipe_error, salt_ids
from harness.inventory.fields import FrozenModel, PositiveTokens
from harness.inventory.frozen import Inventory, InventoryPrompt, assemble_inventory, make_prompt
from harness.inventory.recipe import SALT_TOKENS
from harness.inventory.workload_recipes import (
    ConversationLengthsRecipe,
    ConversationRecipe,
    PrefixGroupRecipe,
    TokenRange,
)

RANGE = re.compile(r"^ *(?P<low>[0-9]+) *(- *(?P<high>[0-9]+) *)?$")

TokenIds = list[int]


def build_prefix_group_inventory(name: str, recipe: PrefixGroupRecipe) -> Inventory:
    """Each group's prefix drawn first, then its prompts' bodies; a salt overwrites each prompt's first tokens."""
    allowed = allowed_ids(recipe.vocabulary)
    rng = np.random.default_rng(recipe.seed)
    prefixes = [allowed[rng.integers(0, allowed.size, size=recipe.shared_prefix_tokens)] for _ in range(recipe.groups)]
    prompts = []
    for index, (length, cap) in enumerate(zip(recipe.prompt_tokens, recipe.output_cap_tokens, strict=True)):
        body = allowed[rng.integers(0, allowed.size, size=length - recipe.shared_prefix_tokens)]
        ids = np.concatenate([prefixes[recipe.group_of(index)], body])
        if recipe.salt is not None:
            ids[:SALT_TOKENS] = salt_ids(recipe.salt, prompt_id(index), allowed)
        prompts.append(make_prompt(prompt_id(index), length, cap, token_ids=[int(t) for t in ids]))
    return assemble_inventory(name, recipe, None, prompts)


class ConversationTurn(FrozenModel):
    """One exchange: the user's message, and the reply recorded for it (None on a last turn that has none)."""

    user_token_ids: TokenIds = Field(min_length=1)
    assistant_token_ids: TokenIds | None = None
    output_cap_tokens: PositiveTokens


class Conversation(FrozenModel):
    conversation_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    turns: list[ConversationTurn] = Field(min_length=1)


def conversation_prompts(conversations: list[Conversation]) -> list[InventoryPrompt]:
    """Turn k's prompt: every earlier user message and recorded reply, in order, then turn k's message.
    A reply missing before a later turn would leave that turn's history unknown: refused."""
    prompts = []
    for conversation in conversations:
        history: TokenIds = []
        for number, turn in enumerate(conversation.turns, start=1):
            ids = history + turn.user_token_ids
            turn_id = f"{conversation.conversation_id}t{number:02d}"
            prompts.append(make_prompt(turn_id, len(ids), turn.output_cap_tokens, token_ids=ids,
                                       conversation_id=conversation.conversation_id, turn=number))
            if turn.assistant_token_ids is None and number < len(conversation.turns):
                raise ValueError(f"conversation {conversation.conversation_id} turn {number}: no recorded reply, "
                                 "so the next turn's history is unknown")
            history = ids + (turn.assistant_token_ids or [])
    return prompts


def build_conversation_inventory(name: str, recipe: ConversationRecipe) -> Inventory:
    """Per conversation, in this order: its turn count, then per turn the user message's length and ids and,
    before a later turn, the reply's length and ids."""
    allowed = allowed_ids(recipe.vocabulary)
    rng = np.random.default_rng(recipe.seed)

    def draw(length: int) -> TokenIds:
        return [int(t) for t in allowed[rng.integers(0, allowed.size, size=length)]]

    conversations = []
    for index in range(recipe.conversations):
        conversation_id = f"c{index:04d}"
        count = recipe.turns.draw(rng)
        turns = []
        for number in range(1, count + 1):
            user = draw(recipe.user_tokens.draw(rng))
            if number == 1 and recipe.salt is not None:
                user[:SALT_TOKENS] = salt_ids(recipe.salt, conversation_id, allowed)
            reply = draw(recipe.assistant_tokens.draw(rng)) if number < count else None
            turns.append(ConversationTurn(user_token_ids=user, assistant_token_ids=reply,
                                          output_cap_tokens=recipe.output_cap_tokens))
        conversations.append(Conversation(conversation_id=conversation_id, turns=turns))
    return assemble_inventory(name, recipe, None, conversation_prompts(conversations))


def build_conversation_lengths_inventory(name: str, recipe: ConversationLengthsRecipe) -> Inventory:
    """Per conversation and turn, in order: the ids that lengthen the turn before it to this turn's count."""
    allowed = allowed_ids(recipe.vocabulary)
    rng = np.random.default_rng(recipe.seed)
    conversations = []
    for index, recorded in enumerate(recipe.conversations):
        before, turns = 0, []
        for turn in recorded:
            added = allowed[rng.integers(0, allowed.size, size=turn.prompt_tokens - before)]
            turns.append(ConversationTurn(user_token_ids=[int(t) for t in added], assistant_token_ids=[],
                                          output_cap_tokens=turn.output_cap_tokens))
            before = turn.prompt_tokens
        conversations.append(Conversation(conversation_id=f"c{index:04d}", turns=turns))
    return assemble_inventory(name, recipe, None, conversation_prompts(conversations))


def prefix_group_recipe(lengths: list[int], caps: list[int], groups: int, **fields: Any) -> PrefixGroupRecipe:
    """A recipe from command-line values: one length (and cap) for every prompt, or one per prompt."""
    count = groups * fields["prompts_per_group"]
    if len(lengths) == 1:
        lengths, caps = lengths * count, caps * count
    elif len(lengths) != count:
        raise HarnessError(f"--prompt-tokens: {len(lengths)} lengths for {groups} groups × "
                           f"{fields['prompts_per_group']} prompts; give one, or one per prompt")
    try:
        return PrefixGroupRecipe(groups=groups, prompt_tokens=lengths, output_cap_tokens=caps, **fields)
    except pydantic.ValidationError as error:
        raise HarnessError(recipe_error(error, "prefix-group recipe")) from None


def conversation_recipe(**fields: Any) -> ConversationRecipe:
    try:
        return ConversationRecipe(**fields)
    except pydantic.ValidationError as error:
        raise HarnessError(recipe_error(error, "conversation recipe")) from None


def token_range(value: str, option: str) -> TokenRange:
    """'64' (fixed) or '32-96' (uniform, both ends included)."""
    match = RANGE.match(value)
    if match is None:
        raise HarnessError(f"{option}: {value!r} is not a whole number or a range like 32-96")
    low, high = int(match["low"]), int(match["high"] or match["low"])
    try:
        return TokenRange(low=low, high=high)
    except pydantic.ValidationError as error:
        raise HarnessError(f"{option}: {value!r}: {error.errors()[0]['msg']}") from None
