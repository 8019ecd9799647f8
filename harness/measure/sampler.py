"""Poll the server's /metrics at a fixed interval while a run is going.

A scrape that fails (timeout, error status, unparsable text) becomes a sample with an error: the run's
requests are the measurement, the samples explain it, and losing one must not lose the other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from harness.errors import HarnessError
from harness.measure.record import ServerSample
from harness.measure.send_path import aiohttp_transport
from harness.observe.server_metrics import parse_metrics


class MetricsSampler:
    """Scrapes on absolute ticks (no drift; a slow scrape skips ticks) over its own connection."""

    def __init__(
        self, base_url: str, interval_s: float, clock_zero: float, on_sample: Callable[[ServerSample], None]
    ) -> None:
        self.interval_s = interval_s
        self.clock_zero = clock_zero
        self.on_sample = on_sample
        self.http = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(max(interval_s, 2.0)),
            transport=aiohttp_transport(base_url, 1),
        )

    async def scrape(self) -> ServerSample:
        t_s = time.perf_counter() - self.clock_zero
        try:
            response = await self.http.get("/metrics")
            response.raise_for_status()
            duration_s = time.perf_counter() - self.clock_zero - t_s
            # ~10 ms of pure-Python parsing per scrape: in a thread, so the GIL's switch interval bounds how
            # long the event loop (and every chunk's timestamp) waits for it
            snapshot = await asyncio.to_thread(parse_metrics, response.text)
            return ServerSample(t_s=t_s, snapshot=snapshot, duration_s=duration_s)
        except (httpx.HTTPError, HarnessError, OSError) as error:
            return ServerSample(t_s=t_s, error=f"{type(error).__name__}: {error}"[:300])

    async def run(self) -> None:
        """Until cancelled. The caller scrapes once before the load and once after it, so counter
        growth covers the whole run."""
        while True:
            elapsed_s = time.perf_counter() - self.clock_zero
            next_tick_s = (int(elapsed_s / self.interval_s) + 1) * self.interval_s
            await asyncio.sleep(next_tick_s - elapsed_s)
            self.on_sample(await self.scrape())

    async def aclose(self) -> None:
        await self.http.aclose()
