"""A server's base URL, checked for its shape before anything waits on it.

The ready wait retries whatever it cannot reach, so a URL that can never answer (no scheme, another
scheme, no host, a port outside 1-65535, a host no resolver can spell) would hold a run for its whole
ready timeout or end in a traceback. The shape is checked here instead, in one line naming the value.
User info is left to `harness.redact.refuse_url_credentials`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

from pydantic import AfterValidator

from harness.errors import HarnessError

if TYPE_CHECKING:
    import httpx

SCHEMES = ("http", "https")
# A host name's labels after IDNA: letters, digits, '-' (not at an end) and '_' (container names use it).
LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
UNPRINTABLE = re.compile(r"[\s\x00-\x1f\x7f]")


def server_url(url: str) -> str:
    """`url` when it can name a server (a pydantic validator: a refusal is a ValueError saying why)."""
    import httpx  # here, not at the top: the CLI declares its options with this type before any URL is read

    if not url.strip():
        raise ValueError("empty; give the server's base URL, e.g. http://127.0.0.1:8000")
    if UNPRINTABLE.search(url):
        raise ValueError("holds a space or a control character")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise ValueError(f"not a URL ({error})") from None
    if parsed.scheme not in SCHEMES:
        raise ValueError("must start with http:// or https://")
    if not parsed.host:
        raise ValueError("names no host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValueError(f"port {parsed.port} is outside 1-65535")
    if parsed.query or parsed.fragment:
        raise ValueError("a base URL takes no query or fragment (the harness appends /health, /v1/...)")
    _check_host(parsed)
    return url


def _check_host(parsed: httpx.URL) -> None:
    """An IP literal as httpx read it, or a name whose every label is one DNS can carry."""
    if ":" in parsed.host:  # an IPv6 literal, which httpx has already parsed
        return
    labels = parsed.raw_host.decode("ascii").rstrip(".").split(".")
    if not all(LABEL.match(label) for label in labels):
        raise ValueError(f"host {parsed.host!r} is not a host name")


def checked_server_url(url: str, option: str) -> str:
    """`server_url` for an option that is not a model field: the refusal is one line naming it."""
    try:
        return server_url(url)
    except ValueError as error:
        raise HarnessError(f"{option}: {error}, not {url!r}") from None


ServerUrl = Annotated[str, AfterValidator(server_url)]
