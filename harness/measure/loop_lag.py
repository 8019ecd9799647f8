"""How late the client's event loop ran: a timer that should fire every few milliseconds, and didn't.

Every chunk's arrival time is stamped when the loop gets to it. A loop blocked by a long callback, a
garbage collection, or a process that got no CPU stamps late by the same amount, so TTFT and ITL grow
by it although the server did nothing. The probe runs through the whole load; its lateness is how much
of any measured figure may be the client's own.
"""

from __future__ import annotations

import asyncio
import time

PROBE_INTERVAL_S = 0.005


class LoopLagProbe:
    def __init__(self, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []

    async def run(self) -> None:
        """Until cancelled; one lateness figure per tick."""
        while True:
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lags_ms.append(max(0.0, (time.perf_counter() - due) * 1000))
