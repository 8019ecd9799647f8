"""`harness run`: send an inventory at a set load, record every request and the server's state.

Schedule, client, sampler and record meet here and nowhere else. SIGINT/SIGTERM stop the load: requests
in flight are recorded as cancelled and the summary is still written, marked invalid.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import uvloop
from rich.console import Console
from rich.progress import Progress

from harness.inventory.check import check_fits, prompt_token_mismatches
from harness.inventory.frozen import Inventory
from harness.measure.client import ClientSettings, RequestRecord, StreamingClient
from harness.measure.dispatch import check_conversation_load, send_all
from harness.measure.loop_lag import LoopLagProbe
from harness.measure.population_figures import population_figures
from harness.measure.ready import discover_server
from harness.measure.record import (
    Environment,
    RunConfig,
    RunWriter,
    ServerSample,
)
from harness.measure.reuse_figures import reuse_figures
from harness.measure.sampler import MetricsSampler
from harness.measure.stats import RunSummary, summarize
from harness.measure.timeouts import READY_TIMEOUT_S
from harness.schema import RunFile

UNCAPPED_POOL_SIZE = 4096


def run_load(
    config: RunConfig,
    inventory: Inventory,
    run_dir: Path,
    *,
    ready_timeout_s: float = READY_TIMEOUT_S,
    on_sample: Callable[[ServerSample], None] | None = None,
    api_key: str | None = None,
    max_num_seqs: int | None = None,
) -> RunSummary:
    """Blocking entry point for the CLI and tests. uvloop: the client must never be the bottleneck, and
    libuv's loop costs less CPU per streamed chunk than asyncio's own. `on_sample` sees every scrape as it
    is kept (live tracking); it runs in the event loop, so it must be quick. `api_key` None: $VLLM_API_KEY.
    `max_num_seqs`: the engine's, when the caller started it, for the predicted live population."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_run(config, inventory, run_dir, ready_timeout_s, on_sample, api_key, max_num_seqs))


async def _run(
    config: RunConfig,
    inventory: Inventory,
    run_dir: Path,
    ready_timeout_s: float,
    on_sample: Callable[[ServerSample], None] | None = None,
    api_key: str | None = None,
    max_num_seqs: int | None = None,
) -> RunSummary:
    served_model, max_model_len, engine_version = await discover_server(config.base_url, ready_timeout_s, api_key)
    if max_model_len is not None:  # before the first request: what the server cannot hold is refused whole
        check_fits(inventory, max_model_len, config.max_tokens)
    check_conversation_load(config.load, inventory)
    writer = RunWriter(run_dir)
    writer.write_model(RunFile.ENVIRONMENT, _environment(served_model, max_model_len, engine_version))
    clock_zero = time.perf_counter()
    config = config.model_copy(update={"clock_zero_unix_s": time.time()})  # the record's wall-clock anchor
    writer.write_model(RunFile.CONFIG, config)
    records: list[RequestRecord] = []
    samples: list[ServerSample] = []

    def keep_sample(sample: ServerSample) -> None:
        samples.append(sample)
        writer.add_sample(sample)
        if on_sample is not None:
            on_sample(sample)

    def finished(record: RequestRecord) -> None:
        records.append(record)
        writer.add_request(record)

    sampler = MetricsSampler(config.base_url, config.sample_interval_s, clock_zero, keep_sample)
    keep_sample(await sampler.scrape())
    sampling = asyncio.create_task(sampler.run())
    loop_lag = LoopLagProbe()
    probing = asyncio.create_task(loop_lag.run())
    settings = _client_settings(config, served_model, api_key)
    interrupted = await _send_load(config, inventory, settings, clock_zero, finished)
    for background in (sampling, probing):
        await _cancelled(background)
    keep_sample(await sampler.scrape())
    await sampler.aclose()
    summary = _summary(config, inventory, records, samples, loop_lag.lags_ms, interrupted)
    population = population_figures(inventory, config, samples, summary.server.peak_kv_cache_usage_fraction,
                                    max_num_seqs)
    summary = summary.model_copy(update={"population": population})
    writer.finish(records, summary)
    return summary


def _environment(served_model: str, max_model_len: int | None, engine_version: str | None) -> Environment:
    return Environment(
        harness_version=_harness_version(),
        python_version=platform.python_version(),
        engine_version=engine_version,
        served_model=served_model,
        max_model_len=max_model_len,
        image_reference=os.environ.get("HARNESS_IMAGE_REFERENCE"),
        model_revision=os.environ.get("HARNESS_MODEL_REVISION"),
    )


def _client_settings(config: RunConfig, served_model: str, api_key: str | None) -> ClientSettings:
    return ClientSettings(
        base_url=config.base_url,
        model=served_model,
        temperature=config.temperature,
        pool_size=config.load.in_flight_limit or UNCAPPED_POOL_SIZE,
        read_timeout_s=config.read_timeout_s,
        stall_timeout_s=config.stall_timeout_s,
        api_key=api_key,
    )


async def _send_load(
    config: RunConfig,
    inventory: Inventory,
    settings: ClientSettings,
    clock_zero: float,
    finished: Callable[[RequestRecord], None],
) -> str | None:
    """Send the whole load under a progress bar; returns the signal that stopped it, None when it ran out."""
    interrupted: list[str] = []
    with RunProgress(_planned_count(config, inventory)) as progress, quiet_garbage_collector():

        def finished_and_counted(record: RequestRecord) -> None:
            finished(record)
            progress.advance(record.error_class is not None)

        async with StreamingClient(settings, clock_zero) as client:
            if config.load.in_flight_limit is not None:
                await client.open_connections(config.load.in_flight_limit)
            load = asyncio.create_task(send_all(config, inventory, client, finished_and_counted))
            with _signals_stop(load, interrupted):
                try:
                    await load
                except asyncio.CancelledError:
                    if not interrupted:
                        raise
    return interrupted[0] if interrupted else None


@contextlib.contextmanager
def _signals_stop(load: asyncio.Task, interrupted: list[str]) -> Iterator[None]:
    """SIGINT and SIGTERM cancel the load and note their name. asyncio resets a removed handler to the
    default, so the caller's own (an engine's stop on SIGTERM) is put back afterwards."""
    loop = asyncio.get_running_loop()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        loop.add_signal_handler(signum, _stop, load, interrupted, signal.Signals(signum).name)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            if handler is not None:  # None: set outside Python, nothing to give back
                signal.signal(signum, handler)


async def _cancelled(background: asyncio.Task) -> None:
    background.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await background


def _summary(
    config: RunConfig,
    inventory: Inventory,
    records: list[RequestRecord],
    samples: list[ServerSample],
    loop_lags_ms: list[float],
    interrupted_by: str | None,
) -> RunSummary:
    usage = [(r.prompt_id, r.prompt_tokens) for r in records if r.prompt_tokens is not None]  # every send
    prefix_cache, turns = reuse_figures(inventory, records, samples)
    return summarize(
        records,
        samples,
        slo=config.slo,
        offered_requests_per_s=config.load.rate_per_s,
        offered_concurrency=config.load.concurrency,
        cold=config.cold,
        max_dispatch_lag_ms=config.max_dispatch_lag_ms,
        sample_interval_s=config.sample_interval_s,
        loop_lags_ms=loop_lags_ms,
        prompt_token_mismatches=len(prompt_token_mismatches(inventory, usage)),
        interrupted_by=interrupted_by,
        max_error_fraction=config.max_error_fraction,
    ).model_copy(update={"run_id": config.run_id, "prefix_cache": prefix_cache, "turns": turns})


@contextlib.contextmanager
def quiet_garbage_collector() -> Iterator[None]:
    """Rare, young-only collections while the load runs. A full collection over the run's growing heap
    stops the event loop for tens of milliseconds, and that pause lands in the TTFT and ITL of every
    request in flight; objects from before the load are frozen out of collections altogether."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(100_000, 50, 1_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _stop(load: asyncio.Task, interrupted: list[str], name: str) -> None:
    interrupted.append(name)
    load.cancel()


def _planned_count(config: RunConfig, inventory: Inventory) -> int | None:
    load = config.load
    if load.requests is not None:
        return load.warmup_requests + load.requests
    return None if load.duration_s is not None else load.warmup_requests + len(inventory.prompts)


def _harness_version() -> str:
    try:
        return version("vllm-serving-harness")
    except PackageNotFoundError:
        return "unknown"


class RunProgress:
    """A rich bar on a terminal; elsewhere (Polyaxon logs, CI) one plain line every few seconds."""

    PLAIN_EVERY_S = 5.0

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.done = 0
        self.errors = 0
        self.started = time.monotonic()
        self.last_line = self.started
        self.bar: Progress | None = Progress(console=Console(stderr=True)) if sys.stderr.isatty() else None

    def __enter__(self) -> RunProgress:
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task("requests", total=self.total)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self.bar.stop()
        else:
            self._line()

    def advance(self, failed: bool) -> None:
        self.done += 1
        self.errors += failed
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=f"requests ({self.errors} errors)")
        elif time.monotonic() - self.last_line >= self.PLAIN_EVERY_S:
            self._line()

    def _line(self) -> None:
        self.last_line = time.monotonic()
        of_total = f"/{self.total}" if self.total is not None else ""
        elapsed_s = self.last_line - self.started
        print(f"requests {self.done}{of_total}, errors {self.errors}, {elapsed_s:.0f} s", file=sys.stderr, flush=True)
