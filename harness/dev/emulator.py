"""A vLLM-shaped HTTP server with scripted timing, for pipeline dry runs and client benchmarks.

It is a test instrument for the client side: every delay it produces is configured, so a client's
measurement can be checked against the truth. Engine behaviour is measured on the real engine.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import secrets
import time
from collections import deque

import prometheus_client
import uvloop
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel, Field

from harness.errors import HarnessError
from harness.predict.architectures import MAX_TOKENS
from harness.predict.budget import MAX_SEQUENCES

MAX_DELAY_MS = 3_600_000  # an hour before a token: longer is a typo, not a scripted server


class EmulatorConfig(BaseModel):
    """Timing and limits of the emulated engine."""

    # ASCII only: the resolver reads a full-width '１２７.0.0.1' as 127.0.0.1, and '' as every interface
    host: str = Field("127.0.0.1", pattern=r"^[A-Za-z0-9.:\-\[\]%]+$")
    port: int = Field(8000, ge=0, le=65535)
    model: str = Field("emulated", pattern=r"^[^\x00-\x1f\x7f]+$")  # one line: it is printed and sent back
    ttft_ms: float = Field(20.0, ge=0, le=MAX_DELAY_MS)
    itl_ms: float = Field(5.0, ge=0, le=MAX_DELAY_MS)
    tokens_per_chunk: int = Field(1, ge=1, le=MAX_TOKENS)
    max_num_seqs: int = Field(256, ge=1, le=MAX_SEQUENCES)
    kv_capacity_tokens: int = Field(1_048_576, ge=1, le=MAX_TOKENS)
    max_model_len: int = Field(4096, ge=1, le=MAX_TOKENS)
    drop_every: int | None = Field(None, ge=1, le=MAX_TOKENS, description="abort every Nth stream's connection")
    api_key: str | None = Field(None, repr=False, description="the key /v1/* require, as vLLM's VLLM_API_KEY")


def count_prompt_tokens(body: dict) -> int:
    """Token ids count as themselves; text counts one token per whitespace-separated word."""
    if "messages" in body:
        return sum(len(str(message.get("content", "")).split()) for message in body["messages"])
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


class Admission:
    """FIFO admission bounded by max_num_seqs and KV tokens, like a scheduler's waiting queue."""

    def __init__(self, max_num_seqs: int, kv_capacity_tokens: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.kv_capacity_tokens = kv_capacity_tokens
        self.running = 0
        self.reserved_tokens = 0
        self.waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def enter(self, tokens: int) -> bool:
        """Returns whether the request had to wait."""
        if not self.waiting and self._fits(tokens):
            self._take(tokens)
            return False
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((tokens, ticket))
        try:
            await ticket
        except asyncio.CancelledError:
            if ticket.done() and not ticket.cancelled():
                self.leave(tokens)
            else:
                self.waiting.remove((tokens, ticket))
            raise
        return True

    def leave(self, tokens: int) -> None:
        self.running -= 1
        self.reserved_tokens -= tokens
        while self.waiting and self._fits(self.waiting[0][0]):
            tokens_next, ticket = self.waiting.popleft()
            self._take(tokens_next)
            ticket.set_result(None)

    def _fits(self, tokens: int) -> bool:
        return self.running < self.max_num_seqs and self.reserved_tokens + tokens <= self.kv_capacity_tokens

    def _take(self, tokens: int) -> None:
        self.running += 1
        self.reserved_tokens += tokens


class EngineMetrics:
    """The subset of vLLM's Prometheus names the harness samples, kept current by the handlers."""

    def __init__(self, config: EmulatorConfig, admission: Admission) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        labels = {"model_name": config.model, "engine": "0"}
        names = list(labels)

        def gauge(name: str, doc: str, read) -> None:
            prometheus_client.Gauge(name, doc, names, registry=self.registry).labels(**labels).set_function(read)

        gauge("vllm:num_requests_running", "Requests running.", lambda: admission.running)
        gauge("vllm:num_requests_waiting", "Requests waiting.", lambda: len(admission.waiting))
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage, 1 means 100 percent.",
            lambda: admission.reserved_tokens / config.kv_capacity_tokens,
        )
        self.preemptions = prometheus_client.Counter(
            "vllm:num_preemptions", "Preemptions.", names, registry=self.registry
        ).labels(**labels)
        self.prompt_tokens = prometheus_client.Counter(
            "vllm:prompt_tokens", "Prefill tokens.", names, registry=self.registry
        ).labels(**labels)
        self.generation_tokens = prometheus_client.Counter(
            "vllm:generation_tokens", "Generated tokens.", names, registry=self.registry
        ).labels(**labels)
        self.prefix_queries = prometheus_client.Counter(
            "vllm:prefix_cache_queries", "Prefix-cache queried tokens.", names, registry=self.registry
        ).labels(**labels)
        self.prefix_hits = prometheus_client.Counter(
            "vllm:prefix_cache_hits", "Prefix-cache hit tokens.", names, registry=self.registry
        ).labels(**labels)
        self.queue_time_seconds = prometheus_client.Histogram(
            "vllm:request_queue_time_seconds", "Time waiting for admission.", names, registry=self.registry
        ).labels(**labels)
        self.preemptions.inc(0)
        prometheus_client.Info(
            "vllm:cache_config", "Cache configuration.", registry=self.registry
        ).info(
            {
                "block_size": "16",
                "kv_cache_size_tokens": str(config.kv_capacity_tokens),
                "num_gpu_blocks": str(config.kv_capacity_tokens // 16),
            }
        )

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


class Emulator:
    """Request handlers; one instance per server."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.admission = Admission(config.max_num_seqs, config.kv_capacity_tokens)
        self.metrics = EngineMetrics(config, self.admission)
        self.arrivals = itertools.count(1)
        self.first_tokens: list[dict] = []  # see `lateness`
        self.peers_seen: set[tuple] = set()
        self.streams_on_new_connections = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.authenticate] if self.config.api_key else [])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/version", self.version)
        app.router.add_post("/emulator/lateness", self.lateness)
        app.router.add_get("/emulator/connections", self.connections)
        app.on_response_prepare.append(self._note_peer)
        return app

    @web.middleware
    async def authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """As vLLM's API server with a key: /v1/* need `Authorization: Bearer <key>`, the rest stays open."""
        sent = request.headers.get("Authorization", "").encode()
        wanted = f"Bearer {self.config.api_key}".encode()
        if request.path.startswith("/v1") and not secrets.compare_digest(sent, wanted):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "emulated"})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.config.model, "object": "model", "max_model_len": self.config.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.Response:
        count = count_prompt_tokens(await request.json())
        return web.json_response(
            {"count": count, "max_model_len": self.config.max_model_len, "tokens": list(range(count))}
        )

    async def lateness(self, request: web.Request) -> web.Response:
        """How late the emulator itself wrote each first token since the last call (and forget them):
        the part of a client's TTFT error that is the server's, not the client's.

        Per first token: the prompt's first token ids (to match a client's record), and on the
        machine's monotonic clock (`time.perf_counter`, shared by every process) when its handler
        started and when the token was written. A client on the same machine splits its TTFT error
        with them: before the handler started, the client's send and the server's accept; after the
        write, the client's read."""
        first_tokens, self.first_tokens = self.first_tokens, []
        return web.json_response({
            "first_token_lateness_ms": [token.pop("late_s") * 1000 for token in first_tokens],
            "first_tokens": first_tokens,
        })

    async def connections(self, request: web.Request) -> web.Response:
        """How many streams were a connection's first request: such a stream had to connect first, and
        carries the connect in its TTFT."""
        return web.json_response({"streams_on_new_connections": self.streams_on_new_connections})

    async def _note_peer(self, request: web.Request, response: web.StreamResponse) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        if peer is None or peer in self.peers_seen:
            return
        self.peers_seen.add(peer)
        if request.path.endswith("completions"):
            self.streams_on_new_connections += 1

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        prompt_tokens = count_prompt_tokens(body)
        max_tokens = int(body.get("max_tokens") or 16)
        if prompt_tokens + max_tokens > self.config.max_model_len:
            message = (
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or completion."
            )
            error = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
            return web.json_response(error, status=400)
        if not body.get("stream"):
            return web.json_response({"error": {"message": "only streaming is emulated", "code": 400}}, status=400)
        options = body.get("stream_options") or {}
        arrival = next(self.arrivals)
        drop = self.config.drop_every is not None and arrival % self.config.drop_every == 0

        live_tokens = prompt_tokens + max_tokens
        waited = await self.admission.enter(live_tokens)
        try:
            admitted = time.perf_counter() if waited else arrived
            self.metrics.queue_time_seconds.observe(admitted - arrived)
            self.metrics.prompt_tokens.inc(prompt_tokens)
            self.metrics.prefix_queries.inc(prompt_tokens)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            chunks = ChunkWriter(self.config.model, chat, prompt_tokens, options)
            if chat:
                await response.write(chunks.role())
            prompt = body.get("prompt")
            account = {"prompt_head": prompt[:8] if isinstance(prompt, list) else None, "handler_start_s": arrived}
            if not await self._stream(request, response, chunks, admitted, max_tokens, drop, account):
                return response
            if options.get("include_usage"):
                await response.write(chunks.usage_only(max_tokens))
            await response.write(b"data: [DONE]\n\n")
            self.metrics.generation_tokens.inc(max_tokens)
            return response
        except ConnectionResetError:  # the client went away (a killed run): nothing to answer
            return web.Response(status=499)
        finally:
            self.admission.leave(live_tokens)

    async def _stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        chunks: ChunkWriter,
        admitted: float,
        max_tokens: int,
        drop: bool,
        account: dict,
    ) -> bool:
        """First token at arrival (or admission, after a wait) + TTFT, then `tokens_per_chunk` tokens per
        chunk on absolute deadlines, so a late wake-up does not delay every later token.

        The first token's write completes `account` and keeps it (see `lateness`). Returns False when the
        connection was dropped on purpose.
        """
        ttft_s = self.config.ttft_ms / 1000
        itl_s = self.config.itl_ms / 1000
        emitted = 0
        sent_chunks = 0
        while emitted < max_tokens:
            batch = 1 if emitted == 0 else min(self.config.tokens_per_chunk, max_tokens - emitted)
            deadline = admitted + ttft_s + (emitted + batch - 1) * itl_s
            while (delay := deadline - time.perf_counter()) > 0:  # uvloop's millisecond timers may wake early
                await asyncio.sleep(delay)
            emitted += batch
            await response.write(chunks.tokens(batch, emitted, emitted == max_tokens))
            if emitted == 1:
                written = time.perf_counter()
                self.first_tokens.append({**account, "written_s": written, "late_s": written - deadline})
            sent_chunks += 1
            if drop and sent_chunks == 2 and request.transport is not None:
                request.transport.abort()
                return False
        return True


class ChunkWriter:
    """Server-sent events in vLLM's shape, formatted directly (json.dumps per chunk is the hot cost)."""

    def __init__(self, model: str, chat: bool, prompt_tokens: int, options: dict) -> None:
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.continuous_usage = bool(options.get("include_usage") and options.get("continuous_usage_stats"))
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.head = (f'data: {{"id":"cmpl-emulated","object":"{kind}","created":{int(time.time())},'
                     f'"model":{json.dumps(model)},"choices":[')

    def role(self) -> bytes:
        choice = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
        return self._event(choice, 0)

    def tokens(self, count: int, completion_tokens: int, last: bool) -> bytes:
        text = " tok" * count
        finish = '"length"' if last else "null"
        if self.chat:
            choice = f'{{"index":0,"delta":{{"content":"{text}"}},"logprobs":null,"finish_reason":{finish}}}'
        else:
            choice = f'{{"index":0,"text":"{text}","logprobs":null,"finish_reason":{finish},"stop_reason":null}}'
        return self._event(choice, completion_tokens)

    def usage_only(self, completion_tokens: int) -> bytes:
        return self.head.encode() + b"]," + self._usage(completion_tokens).encode() + b"}\n\n"

    def _event(self, choice: str, completion_tokens: int) -> bytes:
        usage = "," + self._usage(completion_tokens) if self.continuous_usage else ""
        return f"{self.head}{choice}]{usage}}}\n\n".encode()

    def _usage(self, completion_tokens: int) -> str:
        total = self.prompt_tokens + completion_tokens
        return (
            f'"usage":{{"prompt_tokens":{self.prompt_tokens},"total_tokens":{total},'
            f'"completion_tokens":{completion_tokens}}}'
        )


def serve(config: EmulatorConfig) -> None:
    """Run until interrupted, on uvloop so that the emulator is not the bottleneck at hundreds of streams,
    with a listen backlog that takes a thousand simultaneous connects without SYN retries.
    Like vLLM, no `_created` series next to the counters."""
    prometheus_client.disable_created_metrics()
    gc.freeze()  # what start-up imported is never garbage: a collection need not walk it under load
    try:
        web.run_app(
            Emulator(config).app(),
            host=config.host,
            port=config.port,
            access_log=None,
            print=None,
            backlog=4096,
            loop=uvloop.new_event_loop(),
        )
    except OSError as error:
        raise HarnessError(f"emulator cannot listen on {config.host}:{config.port}: {error}") from error
