"""A capped open loop records when the cap let each held request go: the wait is the cap's, not a late client's."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest

from harness.measure.client import PromptRequest, RequestRecord, StreamingClient
from harness.measure.dispatch import _Load
from harness.measure.schedule import Slot
from harness.measure.stats import dispatch_lag_ms

HOLD_S = 0.3  # each request holds its slot this long


class HoldingClient:
    """Sends nothing: each request holds its slot HOLD_S, then is recorded as the client records it."""

    def __init__(self) -> None:
        self.zero = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.zero

    async def send(self, prompt: PromptRequest, scheduled_s: float | None = None,
                   slot_freed_s: float | None = None) -> RequestRecord:
        dispatch_s = self.now()
        await asyncio.sleep(HOLD_S)
        end_s = self.now()
        return RequestRecord(index=prompt.index, prompt_id=prompt.prompt_id, warmup=False, max_tokens=1,
                             scheduled_s=dispatch_s if scheduled_s is None else scheduled_s, dispatch_s=dispatch_s,
                             slot_freed_s=slot_freed_s, first_token_s=end_s, end_s=end_s, chunk_times_s=[end_s],
                             chunk_tokens=[1])


def test_a_request_due_behind_one_the_cap_held_counts_its_lag_from_the_freed_slot() -> None:
    # cap 2: requests 0 and 1 (due at 0) take both slots and both give them back at 0.3 s. Request 2 (due at
    # 0.05 s) finds both taken and waits for the first; request 3 (due at 0.1 s) finds a slot free when the loop
    # reaches it at 0.3 s, yet it was held too: the loop was waiting at the cap for request 2.
    slots = [Slot(index=i, prompt_index=0, send_at_s=at, warmup=False) for i, at in enumerate((0.0, 0.0, 0.05, 0.1))]
    records: list[RequestRecord] = []
    client = HoldingClient()

    def request(slot: Slot) -> PromptRequest:
        return PromptRequest(index=slot.index, prompt_id=f"p{slot.index}", warmup=False, max_tokens=1,
                             token_ids=[1], text=None, chat=False)

    load = _Load(iter(slots), request, cast(StreamingClient, client), client.now(), records.append)
    asyncio.run(load.open_loop(2))
    by_index = {record.index: record for record in records}
    assert by_index[0].slot_freed_s is None and by_index[1].slot_freed_s is None  # slots were free at their time
    first_end_s = min(by_index[0].end_s, by_index[1].end_s)
    assert by_index[2].slot_freed_s == pytest.approx(first_end_s, abs=0.02)
    assert by_index[3].slot_freed_s == by_index[2].slot_freed_s
    # sent about 250 and 200 ms after their schedule, but within a few ms of the slot coming free
    for index in (2, 3):
        assert by_index[index].dispatch_s - by_index[index].scheduled_s > 0.15
        assert dispatch_lag_ms(by_index[index]) < 50
