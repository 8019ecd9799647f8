"""What an inventory's prompts share, as the prefix-cache prediction reads it: each prompt's segments.

A segment's key is the sha256 of its token ids (of its text for a text prompt), so two prompts share a
segment only when its tokens are equal: a recipe that failed to share its prefix predicts no hit.
Boundaries come from the recipe: a group's shared prefix, a conversation turn's earlier history; for
imported text, from the leading tokens the import found prompts to share (`shared_prefixes`). A recorded
conversation's turn (chat messages) is cut where each earlier turn's prompt ended, each segment keyed by the
messages up to there: the prediction takes the template's rendering of a turn to begin with the rendering of
the turn before it, as a chat template that appends messages renders it.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import defaultdict
from collections.abc import Sequence

from harness.inventory.frozen import Inventory, InventoryPrompt
from harness.inventory.recipe import ImportRecipe, TextRecipe, TokenIdRecipe
from harness.inventory.shared_prefixes import token_ids_sha256
from harness.inventory.workload_recipes import PrefixGroupRecipe
from harness.predict.prefix_cache import PromptSegment, SentPrompt


def prompt_segments(inventory: Inventory) -> dict[str, list[PromptSegment]]:
    """Every prompt's segments, by prompt id. The content hashes settle what is shared: a salted prompt's
    first segment is its own, and so is everything chained after it."""
    recipe = inventory.manifest.recipe
    shared = recipe.shared_prefix_tokens if isinstance(recipe, TokenIdRecipe | PrefixGroupRecipe) else 0
    turns: dict[str, list[tuple[int, int]]] = defaultdict(list)  # conversation → (turn, prompt tokens)
    for prompt in inventory.prompts:
        if prompt.conversation_id is not None and prompt.turn is not None:
            turns[prompt.conversation_id].append((prompt.turn, prompt.prompt_tokens))
    segments = {}
    for prompt in inventory.prompts:
        boundaries = [shared]
        if prompt.conversation_id is not None:  # each turn's prompt starts with the one before
            boundaries = [tokens for turn, tokens in turns[prompt.conversation_id] if turn < (prompt.turn or 0)]
        segments[prompt.prompt_id] = _cut(prompt, boundaries, isinstance(recipe, TextRecipe | ImportRecipe))
    return segments


def _cut(prompt: InventoryPrompt, boundaries: list[int], text: bool) -> list[PromptSegment]:
    """The prompt split at the boundaries. A text prompt's tokens are the server's: it is split where the
    import found it shares leading tokens with others, each part up to there named by those tokens' hash; a
    recorded conversation's turn is split once per turn so far."""
    if prompt.conversation_id is not None and prompt.messages is not None:
        return _turn_segments(prompt, boundaries)
    if text or prompt.token_ids is None:
        return _text_segments(prompt)
    edges = [0, *sorted(b for b in set(boundaries) if 0 < b < prompt.prompt_tokens), prompt.prompt_tokens]
    return [PromptSegment(key=token_ids_sha256(prompt.token_ids[start:end]), tokens=end - start)
            for start, end in itertools.pairwise(edges)]


def _turn_segments(prompt: InventoryPrompt, boundaries: list[int]) -> list[PromptSegment]:
    """Segment j ends where turn j's prompt ended, keyed by turn j's messages (user, assistant, ..., user): the
    first 2j - 1 of this turn's. Turns that do not each render longer than the one before share nothing here."""
    messages = prompt.chat_messages()
    edges = [0, *sorted(boundaries), prompt.prompt_tokens]
    if any(end <= start for start, end in itertools.pairwise(edges)):
        return [PromptSegment(key=_digest(repr(messages)), tokens=prompt.prompt_tokens)]
    return [PromptSegment(key=_digest(repr(messages[:2 * turn - 1])), tokens=end - start)
            for turn, (start, end) in enumerate(itertools.pairwise(edges), start=1)]


def _digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


def _text_segments(prompt: InventoryPrompt) -> list[PromptSegment]:
    segments, start = [], 0
    for prefix in prompt.shared_prefixes or []:
        segments.append(PromptSegment(key=prefix.sha256, tokens=prefix.prefix_tokens - start))
        start = prefix.prefix_tokens
    if start < prompt.prompt_tokens:  # the rest, its own unless another prompt holds the same content
        content = str(prompt.text) if prompt.messages is None else repr(prompt.chat_messages())
        segments.append(PromptSegment(key=_digest(content), tokens=prompt.prompt_tokens - start))
    return segments


def sent_prompts(inventory: Inventory, sent: Sequence[tuple[str, int]]) -> list[SentPrompt]:
    """The requests a run sent, in the order the server took them: (prompt id, output tokens) pairs."""
    segments = prompt_segments(inventory)
    return [SentPrompt(segments=segments[prompt_id], output_tokens=output) for prompt_id, output in sent]
