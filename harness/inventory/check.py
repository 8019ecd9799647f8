"""An inventory held against the server it is sent to: it fits the context, and every count is the server's.

A prompt counted differently by the server than by the manifest would make the run's prompt tokens a
guess; checked before the load (`harness inventory verify`) and again from every response's usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from pydantic import BaseModel

from harness.errors import FieldError, HarnessError
from harness.inventory.frozen import Inventory, InventoryPrompt
from harness.inventory.output_cap import effective_output_cap_tokens
from harness.redact import refuse_url_credentials
from harness.server_auth import auth_headers, check_not_refused


def check_fits(inventory: Inventory, max_model_len: int, max_tokens: int | None = None) -> None:
    """Refuse, before anything is sent, prompts whose prompt + output cap exceed the server's context; the cap
    is the one each request is sent with (`max_tokens` in place of the inventory's when set)."""
    totals = [(p, p.prompt_tokens + effective_output_cap_tokens(p, max_tokens)) for p in inventory.prompts]
    too_long = [(p, total) for p, total in totals if total > max_model_len]
    if not too_long:
        return
    cap = "output cap" if max_tokens is None else f"max_tokens {max_tokens}"
    shown = ", ".join(
        f"{p.prompt_id} ({p.prompt_tokens}+{total - p.prompt_tokens}={total})" for p, total in too_long[:10]
    )
    more = f" and {len(too_long) - 10} more" if len(too_long) > 10 else ""
    detail = (f"inventory {inventory.manifest.name}: {len(too_long)} prompt(s) exceed max_model_len "
              f"{max_model_len} (prompt + {cap} tokens): {shown}{more}")
    if max_tokens is None:
        raise HarnessError(detail)
    raise FieldError("max_tokens", detail)


class PromptTokenMismatch(BaseModel):
    """A prompt whose server-side token count differs from the manifest (or could not be had)."""

    prompt_id: str
    manifest_prompt_tokens: int
    server_prompt_tokens: int | None
    detail: str

    def describe(self) -> str:
        counted = "no count" if self.server_prompt_tokens is None else f"{self.server_prompt_tokens} tokens"
        return f"{self.prompt_id}: manifest {self.manifest_prompt_tokens} tokens, server {counted}: {self.detail}"


def prompt_token_mismatches(
    inventory: Inventory, usage_by_prompt_id: Mapping[str, int] | Iterable[tuple[str, int]]
) -> list[PromptTokenMismatch]:
    """Requests whose server-reported prompt tokens differ from the manifest (run-time drift check).

    Takes a mapping, or (prompt_id, prompt_tokens) pairs, one per request, so a prompt sent several
    times is checked every time it was sent.
    """
    by_id = {p.prompt_id: p for p in inventory.prompts}
    pairs = list(usage_by_prompt_id.items() if isinstance(usage_by_prompt_id, Mapping) else usage_by_prompt_id)
    unknown = sorted({prompt_id for prompt_id, _ in pairs} - set(by_id))
    if unknown:
        raise HarnessError(f"inventory {inventory.manifest.name} has no prompt {', '.join(unknown[:5])}")
    return [
        PromptTokenMismatch(
            prompt_id=prompt_id,
            manifest_prompt_tokens=by_id[prompt_id].prompt_tokens,
            server_prompt_tokens=reported,
            detail="server counted a different number of prompt tokens",
        )
        for prompt_id, reported in pairs
        if reported != by_id[prompt_id].prompt_tokens
    ]


# No run uses this salt, so blocks cached while verifying are never hit by a measured request.
VERIFY_CACHE_SALT = "harness-prompts-verify"


def verify_with_server(
    inventory: Inventory, base_url: str, *, timeout_s: float = 120.0
) -> list[PromptTokenMismatch]:
    """Ask a running vLLM server to count every prompt the way it will count it when served.

    vLLM's /tokenize takes a text `prompt` or chat `messages`, not token ids; token-id prompts are
    therefore counted by the usage of a one-token /v1/completions request, under a cache salt so this
    prefill cannot warm the prefix cache for the run that follows. /v1/* carry the engine's key
    ($VLLM_API_KEY); a server that refuses it ends the check with one line.
    """
    refuse_url_credentials(base_url, "--server")
    try:
        with httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, headers=auth_headers()) as client:
            model, max_model_len = _served_model(client, base_url)
            counts = {
                prompt.prompt_id: _server_count(client, model, max_model_len, prompt)
                for prompt in inventory.prompts
            }
    except httpx.HTTPError as error:
        first_line = (str(error).splitlines() or [""])[0]
        raise HarnessError(f"server {base_url}: {type(error).__name__}: {first_line}") from None
    mismatches = []
    for prompt in inventory.prompts:
        counted, detail = counts[prompt.prompt_id]
        if counted != prompt.prompt_tokens:
            mismatches.append(
                PromptTokenMismatch(
                    prompt_id=prompt.prompt_id,
                    manifest_prompt_tokens=prompt.prompt_tokens,
                    server_prompt_tokens=counted,
                    detail=detail or "server counted a different number of prompt tokens",
                )
            )
    return mismatches


def _served_model(client: httpx.Client, base_url: str) -> tuple[str, int]:
    response = client.get("/v1/models")
    check_not_refused(response, base_url)
    response.raise_for_status()
    try:
        first = response.json()["data"][0]
        return first["id"], int(first["max_model_len"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise HarnessError(f"{response.url}: not a vLLM model list (no data[0].id and max_model_len)") from None


def _server_count(
    client: httpx.Client, model: str, max_model_len: int, prompt: InventoryPrompt
) -> tuple[int | None, str]:
    if prompt.token_ids is not None:
        if prompt.prompt_tokens + 1 > max_model_len:
            return None, f"not checked: does not fit the server's max_model_len {max_model_len}"
        body: dict[str, Any] = {
            "model": model, "prompt": prompt.token_ids, "max_tokens": 1, "temperature": 0,
            "cache_salt": VERIFY_CACHE_SALT,
        }
        response = client.post("/v1/completions", json=body)
    elif prompt.chat:
        response = client.post("/tokenize", json={"model": model, "messages": prompt.messages()})
    else:
        response = client.post("/tokenize", json={"model": model, "prompt": prompt.text})
    if response.status_code != 200:
        return None, f"server answered HTTP {response.status_code}: {response.text[:200]}"
    answer = response.json()
    counted = answer["usage"]["prompt_tokens"] if prompt.token_ids is not None else answer["count"]
    return int(counted), ""
