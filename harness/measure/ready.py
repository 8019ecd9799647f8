"""Waiting for a server to be ready: bounded, visible, and quick to give up on a server that is not vLLM.

A vLLM API server refuses connections while it loads, then answers GET /health with 200 (503 once its
engine died). Any other answer means something else listens there, and waiting longer will not change it.

Every GET /health in the project is asked here: `wait_healthy` for the server a load is sent to,
`wait_until_healthy` for a server this process started (the engine, the emulator), `is_healthy` for one look.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import sys
import time
from typing import Literal

import httpx

from harness.errors import HarnessError
from harness.measure.send_path import aiohttp_transport
from harness.server_auth import REFUSED_STATUSES, auth_headers, check_not_refused, refused_error

HEALTH_PATH = "/health"
POLL_S = 1.0
PROGRESS_EVERY_S = 10.0

StartOutcome = Literal["healthy", "exited", "timed_out"]


async def discover_server(
    base_url: str, ready_timeout_s: float, api_key: str | None = None
) -> tuple[str, int | None, str | None]:
    """Wait for /health, then read the served model, its context length and the engine version. A server
    that refuses the key (GET /v1/models is guarded, /health is not) is one line at once, not a wait."""
    transport = aiohttp_transport(base_url, 1)
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0, transport=transport,
                                 headers=auth_headers(api_key)) as http:
        await wait_healthy(http, base_url, ready_timeout_s)
        try:
            answer = await http.get("/v1/models")
            check_not_refused(answer, base_url)
            answer.raise_for_status()
            card = answer.json()["data"][0]
        except httpx.HTTPStatusError as error:
            raise HarnessError(f"server {base_url}: GET /v1/models gave no model (HTTP "
                               f"{error.response.status_code}): not a vLLM server") from None
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
            raise HarnessError(f"server {base_url}: GET /v1/models gave no model ({_describe(error)}): "
                               "not a vLLM server") from None
        engine_version = None
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
            engine_version = (await http.get("/version")).json()["version"]
    return card["id"], card.get("max_model_len"), engine_version


async def wait_healthy(http: httpx.AsyncClient, base_url: str, ready_timeout_s: float) -> None:
    """Poll /health until 200; a line on stderr at the first miss and every few seconds after says what the
    server last did."""
    started = time.monotonic()
    last_line = -math.inf
    while True:
        try:
            status = (await http.get(HEALTH_PATH)).status_code
        except httpx.HTTPError as error:
            status, last = None, _describe(error)
        else:
            last = f"HTTP {status}"
        if status == 200:
            return
        if status in REFUSED_STATUSES:  # vLLM leaves /health open; a proxy in front of it may not
            raise refused_error(base_url, status, "Authorization" in http.headers)
        if status is not None and 400 <= status < 500:
            raise HarnessError(f"server {base_url}: answers GET /health with {status}: not a vLLM server")
        waited_s = time.monotonic() - started
        if waited_s > ready_timeout_s:
            raise HarnessError(f"server {base_url} not ready (GET /health: {last}) within {ready_timeout_s:g} s")
        if time.monotonic() - last_line >= PROGRESS_EVERY_S:
            last_line = time.monotonic()
            print(f"waiting for {base_url}/health: {waited_s:.0f} of {ready_timeout_s:g} s ({last})",
                  file=sys.stderr, flush=True)
        await asyncio.sleep(POLL_S)


def is_healthy(client: httpx.Client, base_url: str) -> bool:
    """One GET /health: True when it answers 200; any other answer, or none (refused, reset, timed out), is False."""
    try:
        return client.get(f"{base_url}{HEALTH_PATH}").status_code == 200
    except httpx.HTTPError:
        return False


def wait_until_healthy(
    base_url: str,
    timeout_s: float,
    *,
    process: subprocess.Popen | None = None,
    poll_s: float = POLL_S,
    request_timeout_s: float = 2.0,
) -> StartOutcome:
    """Poll GET /health on a server this process started until it answers 200, `process` exits, or
    `timeout_s` pass; which of the three happened is returned, for the caller to word its own error."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=request_timeout_s) as client:
        while True:
            if process is not None and process.poll() is not None:
                return "exited"
            if is_healthy(client, base_url):
                return "healthy"
            if time.monotonic() > deadline:
                return "timed_out"
            time.sleep(poll_s)


def _describe(error: BaseException) -> str:
    cause = error.__cause__ or error
    return f"{type(cause).__name__}: {cause}".strip().rstrip(":")[:200]
