"""One streamed request against an OpenAI-compatible server, timed chunk by chunk.

httpx's API over aiohttp's transport: the default httpx transport costs several times the CPU per
streamed chunk and would make the client the bottleneck at a few hundred streams.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import aiohttp
import httpx
from pydantic import BaseModel

from harness.measure.send_path import Sending, SendTurn, aiohttp_transport
from harness.server_auth import auth_headers

JSON = {"Content-Type": "application/json"}
STALL_SLACK = 0.05  # share of the stall timeout a stall may be reported late by (see StreamingClient._receive)
CONTEXT_OVERFLOW = re.compile(r"context length|max_model_len|cannot be greater than", re.IGNORECASE)


class ErrorClass(StrEnum):
    context_overflow_400 = "context_overflow_400"
    http_4xx = "http_4xx"
    http_5xx = "http_5xx"
    timeout = "timeout"
    stalled = "stalled"
    connection_refused = "connection_refused"
    connection_reset = "connection_reset"
    cancelled = "cancelled"


class RequestRecord(BaseModel):
    """Everything observed about one request; times are seconds on the run's monotonic clock."""

    index: int
    prompt_id: str
    warmup: bool
    max_tokens: int
    scheduled_s: float
    dispatch_s: float
    # Under a capped open loop, for a request that found every slot taken or was due behind one that did: the
    # moment that slot came free. Its dispatch lag counts from then (the cap held it, not a late client); its
    # latencies still count from scheduled_s.
    slot_freed_s: float | None = None
    sent_s: float | None = None  # when the request's last byte was written to the socket
    first_token_s: float | None = None
    end_s: float
    chunk_times_s: list[float] = []
    chunk_tokens: list[int] = []
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    error_class: ErrorClass | None = None
    error: str | None = None
    # A conversation's turn (None for a lone prompt), and the prompt tokens the server reports it served from its
    # prefix cache (`usage.prompt_tokens_details.cached_tokens`: vLLM sends it with --enable-prompt-tokens-details).
    conversation_id: str | None = None
    turn: int | None = None
    cached_prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """What to send: token ids go to /v1/completions as-is; text goes to chat or completions."""

    index: int
    prompt_id: str
    warmup: bool
    max_tokens: int
    token_ids: list[int] | None
    text: str | None
    chat: bool
    messages: list[dict[str, str]] | None = None  # a chat prompt's messages as recorded (else text is one user turn)
    conversation_id: str | None = None
    turn: int | None = None


@dataclass(frozen=True)
class ClientSettings:
    base_url: str
    model: str
    temperature: float = 0.0
    pool_size: int = 256
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 300.0  # from sending to the first response byte: queueing in the server counts
    stall_timeout_s: float = 60.0  # the longest silence once the response has started
    api_key: str | None = field(default=None, repr=False)  # None: $VLLM_API_KEY (see harness.server_auth)


def request_body(model: str, prompt: PromptRequest, temperature: float) -> tuple[str, dict]:
    """The endpoint and JSON body: exactly max_tokens output (ignore_eos) with usage on every chunk."""
    body: dict = {
        "model": model,
        "max_tokens": prompt.max_tokens,
        "temperature": temperature,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if prompt.token_ids is not None:
        return "/v1/completions", {**body, "prompt": prompt.token_ids}
    if prompt.chat:
        messages = prompt.messages if prompt.messages is not None else [{"role": "user", "content": prompt.text or ""}]
        return "/v1/chat/completions", {**body, "messages": messages}
    return "/v1/completions", {**body, "prompt": prompt.text}


def classify_exception(error: BaseException) -> ErrorClass:
    """httpx_aiohttp maps some aiohttp disconnects to httpx timeouts (a refused connect included), so
    look at the cause first."""
    cause = error.__cause__ or error
    if isinstance(cause, ConnectionRefusedError) or isinstance(
        getattr(cause, "os_error", None), ConnectionRefusedError
    ):
        return ErrorClass.connection_refused
    if isinstance(cause, (TimeoutError, asyncio.TimeoutError)) or (
        cause is error and isinstance(error, httpx.TimeoutException)
    ):
        return ErrorClass.timeout
    return ErrorClass.connection_reset


def classify_status(status: int, message: str) -> ErrorClass:
    if status == 400 and CONTEXT_OVERFLOW.search(message):
        return ErrorClass.context_overflow_400
    return ErrorClass.http_4xx if status < 500 else ErrorClass.http_5xx


class StreamingClient:
    """A keep-alive pool sized to the load; `send` never raises, it returns a record."""

    def __init__(self, settings: ClientSettings, clock_zero: float) -> None:
        self.settings = settings
        self.clock_zero = clock_zero
        headers = auth_headers(settings.api_key)
        # Reads are bounded by `send`'s own deadline (read timeout, then stall timeout), not per socket read.
        timeout = httpx.Timeout(None, connect=settings.connect_timeout_s, pool=None)
        self.http = httpx.AsyncClient(
            base_url=settings.base_url, headers=headers, timeout=timeout,
            transport=aiohttp_transport(settings.base_url, settings.pool_size, trace_sends=True),
        )
        self.send_turn = SendTurn()

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.http.aclose()

    def now(self) -> float:
        return time.perf_counter() - self.clock_zero

    async def open_connections(self, count: int) -> None:
        """Open `count` keep-alive connections at once, each with a cheap request, before the load's zero.
        Streams that open together would otherwise each connect first, and the connects (and the server's
        accepts) would land in their TTFT. A failure here is left for the load's own requests to record."""

        async def touch() -> None:
            with contextlib.suppress(httpx.HTTPError):
                await self.http.get("/health")

        await asyncio.gather(*(touch() for _ in range(count)))

    async def send(self, prompt: PromptRequest, scheduled_s: float | None = None,
                   slot_freed_s: float | None = None) -> RequestRecord:
        """`scheduled_s` None: the request is due when its turn to send comes, as a closed loop's next
        request is; the wait for the turn is then the client's time between requests, not the server's
        latency. A scheduled request carries that wait in its dispatch lag and TTFT. `slot_freed_s`: when
        a capped open loop's slot came free for it (see RequestRecord)."""
        stream = StreamState()
        sending = Sending()
        Sending.current.set(sending)
        dispatch_s = self.now()
        status: int | None = None
        error_class: ErrorClass | None = None
        error: str | None = None
        deadline = asyncio.timeout(self.settings.read_timeout_s)
        try:
            async with self.send_turn.take() as give_back_turn:
                sending.give_back_turn = give_back_turn
                await asyncio.sleep(0)  # let work already due run first: the bytes would wait behind it
                dispatch_s = self.now()
                path, body = request_body(self.settings.model, prompt, self.settings.temperature)
                async with deadline, self.http.stream(
                    "POST", path, content=json.dumps(body).encode(), headers=JSON
                ) as response:
                    give_back_turn()
                    status = response.status_code
                    error_class, error = await self._receive(response, stream, deadline)
        except TimeoutError as exc:
            error_class, error = self._timeout_failure(exc, deadline, stream)
        except asyncio.CancelledError:
            error_class = ErrorClass.cancelled
            error = "run stopped while the request was in flight"
        except (httpx.HTTPError, aiohttp.ClientError, OSError) as exc:
            error_class = classify_exception(exc)
            error = _exception_text(exc)
        except (ValueError, KeyError, TypeError) as exc:  # a 200 stream that is not vLLM's SSE shape
            error_class = ErrorClass.http_5xx
            error = _exception_text(exc, "malformed stream: ")
        return RequestRecord(
            index=prompt.index,
            prompt_id=prompt.prompt_id,
            warmup=prompt.warmup,
            max_tokens=prompt.max_tokens,
            scheduled_s=dispatch_s if scheduled_s is None else scheduled_s,
            dispatch_s=dispatch_s,
            slot_freed_s=slot_freed_s,
            sent_s=sending.sent_at[-1] - self.clock_zero if sending.sent_at else None,
            first_token_s=stream.chunk_times_s[0] if stream.chunk_times_s else None,
            end_s=self.now(),
            chunk_times_s=stream.chunk_times_s,
            chunk_tokens=stream.chunk_tokens,
            prompt_tokens=stream.prompt_tokens,
            output_tokens=stream.output_tokens,
            finish_reason=stream.finish_reason,
            http_status=status,
            error_class=error_class,
            error=error,
            conversation_id=prompt.conversation_id,
            turn=prompt.turn,
            cached_prompt_tokens=stream.cached_prompt_tokens,
        )

    def _timeout_failure(
        self, exc: TimeoutError, deadline: asyncio.Timeout, stream: StreamState
    ) -> tuple[ErrorClass, str]:
        """A timeout not the request's own deadline is the transport's; the deadline is the stall timeout
        once bytes arrived, the read timeout before."""
        if not deadline.expired():
            return classify_exception(exc), _exception_text(exc)
        if stream.reads:
            return ErrorClass.stalled, (
                f"no byte for {self.settings.stall_timeout_s:g} s (stall timeout) after {stream.reads} reads"
            )
        return ErrorClass.timeout, f"no response byte within {self.settings.read_timeout_s:g} s (read timeout)"

    async def _receive(
        self, response: httpx.Response, stream: StreamState, deadline: asyncio.Timeout
    ) -> tuple[ErrorClass | None, str | None]:
        """An error status's message, or the stream parsed as it arrives. The first read turns the deadline
        into the stall timeout; a later read moves it only once less than a whole stall timeout is left, to
        1 + STALL_SLACK of one from then (re-arming the timer on every read, ~2.6 µs, cost ~6 % of the
        client's CPU per chunk at 256 streams): a stall is told after at least `stall_timeout_s` of
        silence, at most STALL_SLACK of it later."""
        if response.status_code >= 400:
            message = (await response.aread()).decode(errors="replace")
            return classify_status(response.status_code, message), message[:500]
        loop = asyncio.get_running_loop()
        stall_s = self.settings.stall_timeout_s

        def on_read() -> None:
            now = loop.time()
            when = deadline.when()
            if stream.reads == 1 or when is None or when < now + stall_s:
                deadline.reschedule(now + stall_s * (1 + STALL_SLACK))

        await stream.consume(response, self.clock_zero, on_read=on_read)
        if stream.error is not None:
            return stream.error
        if not stream.done:
            return ErrorClass.connection_reset, "stream ended before [DONE]"
        return None, None


def _exception_text(exc: BaseException, prefix: str = "") -> str:
    return f"{prefix}{type(exc).__name__}: {exc}"[:500]


class StreamState:
    """Server-sent events parsed as they arrive; a chunk's token count comes from continuous usage."""

    def __init__(self) -> None:
        self.chunk_times_s: list[float] = []
        self.chunk_tokens: list[int] = []
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cached_prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.error: tuple[ErrorClass, str] | None = None
        self.done = False
        self.reads = 0
        self.completion_tokens_seen = 0

    async def consume(self, response: httpx.Response, clock_zero: float, on_read: Callable[[], object]) -> None:
        """Each read is decoded once; json.loads of bytes would sniff the encoding of every event.
        `on_read` runs after every read: the stall clock restarts from there."""
        utf8 = codecs.getincrementaldecoder("utf-8")()
        pending = ""
        async for raw in response.aiter_raw():
            arrived_s = time.perf_counter() - clock_zero
            events = (pending + utf8.decode(raw)).split("\n\n")
            pending = events.pop()
            self.reads += 1
            on_read()
            for event in events:
                if event.startswith("data: "):
                    self.on_event(event[6:], arrived_s)

    def on_event(self, data: str, arrived_s: float) -> None:
        if data == "[DONE]":
            self.done = True
            return
        message = json.loads(data)
        if "error" in message:
            detail = message["error"]
            code = detail.get("code") if isinstance(detail, dict) else None
            status = code if isinstance(code, int) else 500
            self.error = (classify_status(status, str(detail)), str(detail)[:500])
            return
        usage = message.get("usage")
        choices = message.get("choices")
        if choices:
            choice = choices[0]
            if usage is not None:
                tokens = usage["completion_tokens"] - self.completion_tokens_seen
                self.completion_tokens_seen = usage["completion_tokens"]
            else:
                delta = choice.get("delta")
                tokens = 1 if (choice.get("text") or (delta and delta.get("content"))) else 0
            if tokens > 0:
                self.chunk_times_s.append(arrived_s)
                self.chunk_tokens.append(tokens)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if usage is not None:
            self.prompt_tokens = usage["prompt_tokens"]
            self.output_tokens = usage["completion_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.cached_prompt_tokens = details["cached_tokens"]
