"""How a request's bytes leave the client: aiohttp's transport, the trace hooks that time each write,
and the turn that sends one request at a time."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport


def aiohttp_transport(base_url: str, max_connections: int, *, trace_sends: bool = False) -> AiohttpTransport:
    """httpx over aiohttp. A plain-HTTP server gets no verifying TLS context: building one loads the CA
    bundle (~80 ms of CPU) for connections that never use it. `trace_sends` times each request's bytes
    leaving the client and gives the send turn back (see `Sending`)."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    verify = base_url.startswith("https://")
    if not trace_sends:
        return AiohttpTransport(limits=limits, verify=verify)

    def traced_session() -> aiohttp.ClientSession:  # called inside the event loop, on first use
        connector = aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=limits.keepalive_expiry,
                                         ssl=httpx.create_ssl_context(verify=verify) if verify else False)
        return aiohttp.ClientSession(connector=connector, trace_configs=[Sending.trace_config()])

    return AiohttpTransport(limits=limits, verify=verify, client=traced_session)


class Sending:
    """One request on its way out: when its bytes left the client, and its turn to send.

    A request's coroutine starting (dispatch) is not its bytes leaving: between the two lie the pool
    wait, a connection being opened, and an event loop busy with other streams. httpx hides aiohttp's
    per-request trace context, so each `send` puts its `Sending` in a context variable, which aiohttp's
    trace callbacks (running in the sending task or one it spawned) find. They stamp each write, and give
    the turn back as the body goes out, or as a connect starts (a connect waits on the network, not on
    this client's CPU).
    """

    current: contextvars.ContextVar[Sending] = contextvars.ContextVar("sending")

    def __init__(self) -> None:
        self.sent_at: list[float] = []
        self.give_back_turn: Callable[[], None] = lambda: None

    @classmethod
    def trace_config(cls) -> aiohttp.TraceConfig:
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(cls._headers_sent)
        trace.on_request_chunk_sent.append(cls._chunk_sent)
        trace.on_connection_create_start.append(cls._connecting)
        return trace

    @classmethod
    async def _headers_sent(cls, *_: object) -> None:
        if (sending := cls.current.get(None)) is not None:
            sending.sent_at.append(time.perf_counter())

    @classmethod
    async def _chunk_sent(cls, *_: object) -> None:
        """aiohttp calls this just before it writes the chunk, in the same step: the next request's turn
        starts after these bytes are on the socket."""
        if (sending := cls.current.get(None)) is not None:
            sending.sent_at.append(time.perf_counter())
            sending.give_back_turn()

    @classmethod
    async def _connecting(cls, *_: object) -> None:
        if (sending := cls.current.get(None)) is not None:
            sending.give_back_turn()


class SendTurn:
    """Requests are built and written one at a time, each to the socket before the next is built.

    Without turns, streams that become due in the same loop turn (a burst of arrivals, or a closed
    loop's streams ending together) each build their request, and aiohttp writes every one from a task
    of the next turn (Python 3.11 has no eager tasks): the first request's bytes wait for all the others'
    building, and the last one's for all the others' writing, ~0.4 ms each. With turns, a request's send
    delay is its own building and writing, plus what the loop runs between their steps (other streams'
    chunks and endings: the first request of 64 that end together on one core still waits up to ~8 ms,
    see benchmarks/client_overhead.py); the wait for its turn comes before, where it is the client's
    (see `StreamingClient.send`)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def take(self) -> AsyncIterator[Callable[[], None]]:
        """Yields the function that gives the turn back; it is given back on leaving in any case."""
        await self.lock.acquire()
        held = True

        def give_back() -> None:
            nonlocal held
            if held:
                held = False
                self.lock.release()

        try:
            yield give_back
        finally:
            give_back()
