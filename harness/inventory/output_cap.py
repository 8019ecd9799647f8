"""The output cap a request is sent with: the run's `max_tokens` for every prompt when set, else the prompt's own.

The fit against the server's context, the read timeout and every request read it here, so a run that lowers
(or raises) the caps is checked, waited for and sent with the same numbers.
"""

from __future__ import annotations

from harness.inventory.frozen import Inventory, InventoryPrompt


def effective_output_cap_tokens(prompt: InventoryPrompt, max_tokens: int | None) -> int:
    """`max_tokens` replaces every prompt's cap, above or below it; None keeps the inventory's."""
    return max_tokens if max_tokens is not None else prompt.output_cap_tokens


def longest_output_cap_tokens(inventory: Inventory, max_tokens: int | None) -> int:
    return max(effective_output_cap_tokens(prompt, max_tokens) for prompt in inventory.prompts)


def request_tokens(inventory: Inventory, max_tokens: int | None) -> list[int]:
    """Each prompt's tokens at their most once sent: the prompt and the output cap it is sent with."""
    return [prompt.prompt_tokens + effective_output_cap_tokens(prompt, max_tokens) for prompt in inventory.prompts]
