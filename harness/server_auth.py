"""Where a request's credentials come from: the engine's key, sent the way vLLM's API server checks it.

vLLM guards /v1/* with `Authorization: Bearer <key>` when it is started with --api-key or VLLM_API_KEY;
/health, /metrics, /version and /tokenize stay open. The harness reads the same variable, so one setting
serves the engine and the client, and the key never travels in a URL, a record or a command line it writes.
"""

from __future__ import annotations

import os

import httpx

from harness.errors import HarnessError
from harness.redact import remember

API_KEY_ENV = "VLLM_API_KEY"
REFUSED_STATUSES = (401, 403)


def api_key(given: str | None = None) -> str | None:
    """The key to send: one given (the `--api-key` of an engine the harness started), else $VLLM_API_KEY."""
    key = given or os.environ.get(API_KEY_ENV) or None
    if key:
        remember(key)
    return key


def auth_headers(given: str | None = None) -> dict[str, str]:
    """The headers every request to an engine carries: the bearer key, or none when no key is set."""
    key = api_key(given)
    return {"Authorization": f"Bearer {key}"} if key else {}


def refused_error(base_url: str, status: int, key_sent: bool) -> HarnessError:
    """One line for a server that wants a key, or another one: where the harness reads it from."""
    sent = " (the key sent is not the engine's)" if key_sent else ""
    return HarnessError(f"server {base_url} refused the request: HTTP {status}, set {API_KEY_ENV} to the "
                        f"engine's key{sent}")


def check_not_refused(response: httpx.Response, base_url: str) -> None:
    """A 401 or 403 ends the run at once with `refused_error`: waiting or retrying will not change the key."""
    if response.status_code in REFUSED_STATUSES:
        raise refused_error(base_url, response.status_code, "Authorization" in response.request.headers)
