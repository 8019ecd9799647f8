"""Sending the planned load through the client: closed-loop workers or an open-loop dispatcher.

Requests that become due together go out one at a time (`SendTurn`); on cancellation, requests in flight
end as 'cancelled' records. A conversation's turns go to one closed-loop worker, in order, each sent only
after the one before it ended (and the load's think time passed): the concurrency is then conversations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from harness.errors import HarnessError
from harness.inventory.frozen import Inventory, InventoryPrompt
from harness.inventory.output_cap import effective_output_cap_tokens
from harness.measure.client import ErrorClass, PromptRequest, RequestRecord, StreamingClient
from harness.measure.record import RunConfig
from harness.measure.schedule import LoadShape, Slot, plan

Finished = Callable[[RequestRecord], None]


async def send_all(config: RunConfig, inventory: Inventory, client: StreamingClient, finished: Finished) -> None:
    """Closed loop: N workers, each sending its next request the moment its last one ends.
    Open loop: a dispatcher that sends at the scheduled times, waiting for a free slot under a cap."""
    slots = plan(config.load, len(inventory.prompts))
    load_start_s = client.now()  # the schedule's zero: after the baseline scrape, not at the clock's zero

    def request(slot: Slot) -> PromptRequest:
        return _request(slot, inventory.prompts[slot.prompt_index], config)

    def conversation(slot: Slot) -> str | None:
        return inventory.prompts[slot.prompt_index].conversation_id

    load = _Load(slots, request, client, load_start_s, finished)
    if config.load.concurrency is not None:
        jobs = conversation_jobs(slots, conversation)
        await load.closed_loop(config.load.concurrency, config.load.duration_s, jobs, config.load.think_time_s)
    else:
        await load.open_loop(config.load.max_concurrency)


def check_conversation_load(load: LoadShape, inventory: Inventory) -> None:
    """A conversation's turns are sent in order by one worker: a closed loop, over the inventory in order."""
    if not any(prompt.conversation_id is not None for prompt in inventory.prompts):
        if load.think_time_s:
            raise HarnessError(f"--think-time-s {load.think_time_s:g}: inventory {inventory.manifest.name} holds no "
                               "conversations, so there is no turn to think after")
        return
    if load.concurrency is None:
        raise HarnessError(f"inventory {inventory.manifest.name} holds conversations: give --concurrency "
                           "(conversations in flight), not --rate")
    if load.order != "inventory":
        raise HarnessError(f"--order {load.order}: inventory {inventory.manifest.name} holds conversations, whose "
                           "turns are sent in their order")


def conversation_jobs(slots: Iterator[Slot], conversation: Callable[[Slot], str | None]) -> Iterator[list[Slot]]:
    """Consecutive slots of one conversation as one job, a new pass over the inventory starting a new one; a
    prompt outside any conversation is a job of its own. Lazy: the workers share it, as they share the slots."""
    job: list[Slot] = []
    for slot in slots:
        same = job and conversation(slot) is not None and conversation(slot) == conversation(job[-1])
        if job and not (same and slot.prompt_index > job[-1].prompt_index):
            yield job
            job = []
        job.append(slot)
    if job:
        yield job


@dataclass(frozen=True, slots=True)
class _Load:
    """One run's slots, how each becomes a request, and where its record goes."""

    slots: Iterator[Slot]
    request: Callable[[Slot], PromptRequest]
    client: StreamingClient
    start_s: float
    finished: Finished

    async def closed_loop(
        self, concurrency: int, duration_s: float | None, jobs: Iterator[list[Slot]], think_time_s: float = 0.0
    ) -> None:
        """The workers share the one job iterator, so each slot is sent once, by whichever worker is free; a job's
        slots (a conversation's turns) one after another, `think_time_s` apart. A worker stops past the duration
        or once its request was cancelled."""

        async def worker() -> None:
            for job in jobs:
                for number, slot in enumerate(job):
                    if duration_s is not None and self.client.now() - self.start_s > duration_s:
                        return
                    if number and think_time_s:
                        await asyncio.sleep(think_time_s)
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
        them: then a send waits for a free slot, and its latency still counts from the scheduled time. A send
        that waited, or was due behind one that did, records when that slot came free, so that the wait is not
        taken for a late client."""
        free_slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        freed_at_s: list[float] = []  # when each slot was given back, in order
        cap_released_s: float | None = None  # when a slot last came free for a send that found them all taken
        in_flight: set[asyncio.Task] = set()

        async def one(slot: Slot, scheduled_s: float, slot_freed_s: float | None) -> None:
            try:
                self.finished(await self.client.send(self.request(slot), scheduled_s, slot_freed_s))
            finally:
                if free_slots is not None:
                    freed_at_s.append(self.client.now())
                    free_slots.release()

        try:
            for slot in self.slots:
                assert slot.send_at_s is not None
                scheduled_s = self.start_s + slot.send_at_s
                await asyncio.sleep(max(scheduled_s - self.client.now(), 0.0))  # a late send still waits one turn
                # due while the cap held the loop on an earlier send: the cap, not the client, kept it back
                slot_freed_s = cap_released_s if cap_released_s is not None and cap_released_s > scheduled_s else None
                if free_slots is not None:
                    every_slot_taken, releases_before = free_slots.locked(), len(freed_at_s)
                    await free_slots.acquire()
                    if every_slot_taken:  # the first slot given back after this send began to wait is its own
                        slot_freed_s = cap_released_s = freed_at_s[releases_before]
                task = asyncio.create_task(one(slot, scheduled_s, slot_freed_s))
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
        conversation_id=prompt.conversation_id,
        turn=prompt.turn,
    )
