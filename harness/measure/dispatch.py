"""Sending the planned load through the client: closed-loop workers or an open-loop dispatcher.

Requests that become due together go out one at a time (`SendTurn`); on cancellation, requests in flight
end as 'cancelled' records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from harness.inventory.frozen import Inventory, InventoryPrompt
from harness.inventory.output_cap import effective_output_cap_tokens
from harness.measure.client import ErrorClass, PromptRequest, RequestRecord, StreamingClient
from harness.measure.record import RunConfig
from harness.measure.schedule import Slot, plan

Finished = Callable[[RequestRecord], None]


async def send_all(config: RunConfig, inventory: Inventory, client: StreamingClient, finished: Finished) -> None:
    """Closed loop: N workers, each sending its next request the moment its last one ends.
    Open loop: a dispatcher that sends at the scheduled times, waiting for a free slot under a cap."""
    slots = plan(config.load, len(inventory.prompts))
    load_start_s = client.now()  # the schedule's zero: after the baseline scrape, not at the clock's zero

    def request(slot: Slot) -> PromptRequest:
        return _request(slot, inventory.prompts[slot.prompt_index], config)

    load = _Load(slots, request, client, load_start_s, finished)
    if config.load.concurrency is not None:
        await load.closed_loop(config.load.concurrency, config.load.duration_s)
    else:
        await load.open_loop(config.load.max_concurrency)


@dataclass(frozen=True, slots=True)
class _Load:
    """One run's slots, how each becomes a request, and where its record goes."""

    slots: Iterator[Slot]
    request: Callable[[Slot], PromptRequest]
    client: StreamingClient
    start_s: float
    finished: Finished

    async def closed_loop(self, concurrency: int, duration_s: float | None) -> None:
        """The workers share the one slot iterator, so each slot is sent once, by whichever worker is free;
        a worker stops past the duration or once its request was cancelled."""

        async def worker() -> None:
            for slot in self.slots:
                if duration_s is not None and self.client.now() - self.start_s > duration_s:
                    return
                record = await self.client.send(self.request(slot))  # due when its turn to send comes
                self.finished(record)
                if record.error_class == ErrorClass.cancelled:
                    return

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            await asyncio.gather(*workers)
        except asyncio.CancelledError:
            await _cancel_all(workers)
            raise

    async def open_loop(self, max_concurrency: int | None) -> None:
        """Each slot sent at its scheduled time, however many are in flight, unless `max_concurrency` caps
        them: then a send waits for a free slot, and its latency still counts from the scheduled time."""
        free_slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        in_flight: set[asyncio.Task] = set()

        async def one(slot: Slot, scheduled_s: float) -> None:
            try:
                self.finished(await self.client.send(self.request(slot), scheduled_s))
            finally:
                if free_slots is not None:
                    free_slots.release()

        try:
            for slot in self.slots:
                assert slot.send_at_s is not None
                scheduled_s = self.start_s + slot.send_at_s
                await asyncio.sleep(max(scheduled_s - self.client.now(), 0.0))  # a late send still waits one turn
                if free_slots is not None:
                    await free_slots.acquire()
                task = asyncio.create_task(one(slot, scheduled_s))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await asyncio.gather(*in_flight)
        except asyncio.CancelledError:
            await _cancel_all(in_flight)
            raise


async def _cancel_all(tasks: Collection[asyncio.Task]) -> None:
    """Cancel the load's tasks and wait until each has recorded its request as cancelled."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _request(slot: Slot, prompt: InventoryPrompt, config: RunConfig) -> PromptRequest:
    return PromptRequest(
        index=slot.index,
        prompt_id=prompt.prompt_id,
        warmup=slot.warmup,
        max_tokens=effective_output_cap_tokens(prompt, config.max_tokens),
        token_ids=prompt.token_ids,
        text=prompt.text,
        chat=prompt.chat,
        messages=prompt.chat_messages() if prompt.messages is not None else None,
    )
