"""The client, runner and record against the emulated server, whose every delay is known.

The emulator runs in its own process (as a real server would), so its timing is not disturbed by the
client's event loop. These tests are about the client side only; engine behaviour is tested on the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import HarnessError
from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange, write_inventory
from harness.loopback import free_port
from harness.measure.client import ClientSettings, ErrorClass, PromptRequest, RequestRecord, StreamingClient
from harness.measure.record import read_requests, read_samples
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape
from harness.measure.stats import MAX_LOOP_STALL_SHARE, MIN_LOOP_STALLED_MS, RunSummary

import child_programs
from conftest import emulator, invalid_but_for_a_busy_machine


@pytest.fixture(scope="module")
def inventory_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recipe = TokenIdRecipe(
        vocabulary=VocabularyRange(low=10, high=1900),
        prompt_tokens=[16, 24, 32, 40] * 5,
        output_cap_tokens=[11] * 20,
        seed=0,
    )
    return write_inventory(build_token_id_inventory("emulated-20", recipe), tmp_path_factory.mktemp("inventory"))


def run(inventory_dir: Path, base_url: str, out: Path, *, max_tokens: int | None = None, **load: object) -> RunSummary:
    config, inventory = build_run_config(RunOptions(inventory=inventory_dir, base_url=base_url, load=LoadShape(**load),
                                                    max_tokens=max_tokens, sample_interval_s=0.2))
    return run_load(config, inventory, out, ready_timeout_s=20)


@contextmanager
def busy_cores(seconds: float) -> Iterator[list[subprocess.Popen]]:
    """A second workload at the harness's own priority: one busy process per core this test may use, each
    ending by itself after `seconds` at the latest and killed on the way out."""
    loops = [subprocess.Popen(child_programs.argv("busy-loop", str(seconds)))
             for _ in os.sched_getaffinity(0)]
    try:
        yield loops
    finally:
        for loop in loops:
            loop.kill()
            loop.wait(timeout=10)


def test_injected_ttft_and_itl_are_recovered(inventory_dir: Path, tmp_path: Path) -> None:
    """A TTFT long enough that the fixed costs of eight simultaneous sends on a busy 2-core machine (a few ms of
    client send delay, request parsing in the emulator) stay inside a 5 % tolerance."""
    with emulator(ttft_ms=400, itl_ms=20, tokens_per_chunk=2) as base_url:
        summary = run(inventory_dir, base_url, tmp_path, concurrency=8, requests=40, warmup_requests=4)
        server_lateness_ms = httpx.post(f"{base_url}/emulator/lateness").json()["first_token_lateness_ms"]
    assert len(server_lateness_ms) == 44  # the emulator's own account of every first token it wrote
    assert summary.requests_ok == 40 and summary.errors_by_class == {}
    # TTFT = the injected 400 ms, + how late the emulator itself wrote the first token (its own account), + the
    # client's and the transfer's share, which must stay within 5 % (20 ms).
    server_late_ms = float(np.percentile(server_lateness_ms, 75))
    ttft_p50_ms = summary.latency["ttft_ms_p50"]
    assert ttft_p50_ms is not None and 400.0 <= ttft_p50_ms <= 420.0 + server_late_ms
    # 2 tokens per chunk every 40 ms is 20 ms per token, not 40.
    assert summary.latency["itl_ms_p50"] == pytest.approx(20.0, abs=1.0)
    assert summary.latency["tpot_ms_mean"] == pytest.approx(20.0, abs=1.0)
    records = [r for r in read_requests(tmp_path) if not r.warmup]
    assert len(records) == 40
    for record in records:
        assert record.output_tokens == 11 and sum(record.chunk_tokens) == 11
        assert record.chunk_tokens == [1, 2, 2, 2, 2, 2]
        assert record.finish_reason == "length" and record.http_status == 200
    assert invalid_but_for_a_busy_machine(summary.invalid_reasons) == []


def test_short_runs_beside_a_busy_loop_on_every_core_are_valid_unless_the_client_really_stalled(
    inventory_dir: Path, tmp_path: Path
) -> None:
    """Runs of the kind the tests make (8 requests at concurrency 4, 0.4 s) while every core also runs a busy
    process at the same priority: a scheduling hiccup of the client's loop must not make a run invalid, and
    where the load did hold the client back past a limit, the run must say so, naming the client's own figure."""
    with emulator(ttft_ms=20, itl_ms=20) as base_url, busy_cores(seconds=60) as loops:
        summaries = [run(inventory_dir, base_url, tmp_path / f"run-{i}", concurrency=4, requests=8, max_tokens=10)
                     for i in range(3)]
        # the second workload ran through every run, and ran: a busy loop spends whatever CPU it is given
        assert all(loop.poll() is None and sum(psutil.Process(loop.pid).cpu_times()[:2]) > 0 for loop in loops)
    for summary in summaries:
        assert summary.requests_ok == 8 and summary.errors_by_class == {}
        assert all(reason.startswith("client ") for reason in summary.invalid_reasons), summary.invalid_reasons
        for reason in summary.invalid_reasons:
            if probed := re.search(r"of (\d+) ms probed", reason):  # stalled: past 5 % and past 50 ms in all
                stall_share = summary.health.loop_stall_share
                assert stall_share is not None and stall_share > MAX_LOOP_STALL_SHARE, reason
                assert stall_share * float(probed[1]) > MIN_LOOP_STALLED_MS, reason


def test_client_queueing_under_a_capped_rate_shows_in_latency_not_as_a_late_client(
    inventory_dir: Path, tmp_path: Path
) -> None:
    """40 req/s offered; 2 slots of ~220 ms each serve about 9 req/s, so requests wait on the client for a slot:
    the wait is in their TTFT (the user waited), and the shortfall in the achieved rate; the client's own lag
    counts from the moment a slot came free."""
    with emulator(ttft_ms=20, itl_ms=20) as base_url:
        summary = run(inventory_dir, base_url, tmp_path, rate_per_s=40.0, max_concurrency=2, requests=30, max_tokens=10)
    records = read_requests(tmp_path)
    queued = [r for r in records if r.dispatch_s - r.scheduled_s > 0.1]
    assert len(queued) > 15
    # every request sent late was held by the cap (it found the slots taken, or was due behind one that did),
    # and a slot comes free when a request ends: each one's slot_freed_s is an earlier request's end
    freed_s = [r.slot_freed_s for r in queued if r.slot_freed_s is not None]
    assert len(freed_s) == len(queued)
    assert all(min(abs(freed - other.end_s) for other in records) < 0.005 for freed in freed_s)
    from_dispatch_ms = sorted((r.first_token_s - r.dispatch_s) * 1000 for r in records if r.first_token_s is not None)
    assert len(from_dispatch_ms) == len(records) == 30  # every request had its first token
    assert from_dispatch_ms[len(records) // 2] < 30.0  # the server itself answers in ~20 ms
    ttft_p50_ms, dispatch_lag_p99_ms = summary.latency["ttft_ms_p50"], summary.latency["dispatch_lag_ms_p99"]
    assert ttft_p50_ms is not None and ttft_p50_ms > 500.0  # but the user waited for a slot first
    # counted from the schedule the lag would pass 1,000 ms; from the freed slot it is the client's own, small
    assert max((r.dispatch_s - r.scheduled_s) * 1000 for r in records) > 1000.0
    assert dispatch_lag_p99_ms is not None and dispatch_lag_p99_ms < 100.0
    assert not any("fell behind its schedule" in reason for reason in summary.invalid_reasons)
    assert summary.achieved_dispatch_per_s < 0.5 * 40.0


def test_server_side_waiting_appears_in_the_samples(inventory_dir: Path, tmp_path: Path) -> None:
    with emulator(ttft_ms=20, itl_ms=50, max_num_seqs=2) as base_url:
        summary = run(inventory_dir, base_url, tmp_path, concurrency=8, requests=16, max_tokens=10)
    assert summary.server.peak_waiting_requests is not None and summary.server.peak_waiting_requests >= 4
    assert summary.failed_scrapes == 0
    assert len(read_samples(tmp_path)) >= 5
    # the server made requests wait: no verdict against the run but what a busy machine would give it
    assert invalid_but_for_a_busy_machine(summary.invalid_reasons) == []


def test_dropped_connections_become_error_records(inventory_dir: Path, tmp_path: Path) -> None:
    with emulator(ttft_ms=5, itl_ms=5, drop_every=3) as base_url:
        summary = run(inventory_dir, base_url, tmp_path, concurrency=4, requests=30)
    assert summary.requests_sent == 30
    assert summary.errors_by_class == {"connection_reset": 10}
    assert summary.requests_ok == 20
    broken = [r for r in read_requests(tmp_path) if r.error_class is not None]
    assert all(len(r.chunk_times_s) == 2 and r.finish_reason is None for r in broken)


def test_a_context_overflow_is_classified_from_the_servers_400(inventory_dir: Path) -> None:
    async def send_too_long(base_url: str) -> tuple[int | None, ErrorClass | None]:
        settings = ClientSettings(base_url=base_url, model="emulated")
        async with StreamingClient(settings, time.perf_counter()) as client:
            prompt = PromptRequest(0, "long", False, 100, list(range(60)), None, False)
            record = await client.send(prompt, client.now())
        return record.http_status, record.error_class

    with emulator(max_model_len=128) as base_url:
        assert asyncio.run(send_too_long(base_url)) == (400, ErrorClass.context_overflow_400)


def test_a_thousand_concurrent_streams_complete_without_error(tmp_path: Path) -> None:
    recipe = TokenIdRecipe(
        vocabulary=VocabularyRange(low=10, high=1900),
        prompt_tokens=[8] * 1000,
        output_cap_tokens=[4] * 1000,
        seed=1,
    )
    inventory_dir = write_inventory(build_token_id_inventory("thousand", recipe), tmp_path / "inventory")
    with emulator(ttft_ms=200, itl_ms=20, max_num_seqs=1024) as base_url:
        summary = run(inventory_dir, base_url, tmp_path / "run", concurrency=1000)
    assert summary.requests_ok == 1000
    assert summary.errors_by_class == {}
    assert summary.server.peak_waiting_requests == 0


@pytest.mark.parametrize("load", [{"concurrency": 16}, {"rate_per_s": 1000.0, "max_concurrency": 16}])
def test_the_pool_is_open_before_the_first_scheduled_send(inventory_dir: Path, tmp_path: Path, load: dict) -> None:
    """16 streams that open at once each find a kept-alive connection opened before the load's zero, so no
    stream's TTFT carries a connect: the emulator sees no stream arrive as a connection's first request.
    Without the pool opened first, each of the first 16 sends would connect."""
    with emulator(ttft_ms=5, itl_ms=1) as base_url:
        run(inventory_dir, base_url, tmp_path, requests=20, max_tokens=4, **load)
        connections = httpx.get(f"{base_url}/emulator/connections").json()
    records = read_requests(tmp_path)
    assert len(records) == 20 and all(r.error_class is None for r in records)
    assert connections["streams_on_new_connections"] == 0


def test_requests_due_together_go_out_one_at_a_time(inventory_dir: Path) -> None:
    """Eight sends started in one loop pass: each request's clock starts only once the one before it has
    written its bytes, so no request's send delay holds another's building and writing. Without the turn,
    all eight would be dispatched before any byte left."""

    async def eight_at_once(base_url: str) -> list:
        settings = ClientSettings(base_url=base_url, model="emulated")
        async with StreamingClient(settings, time.perf_counter()) as client:
            await client.open_connections(8)
            prompts = [PromptRequest(i, f"p{i}", False, 4, [10 + i] * 8, None, False) for i in range(8)]
            return await asyncio.gather(*(client.send(prompt) for prompt in prompts))

    with emulator(ttft_ms=50, itl_ms=1) as base_url:
        records = asyncio.run(eight_at_once(base_url))
        first_tokens = httpx.post(f"{base_url}/emulator/lateness").json()["first_tokens"]
    assert all(r.error_class is None and r.sent_s is not None for r in records)
    records.sort(key=lambda r: r.dispatch_s)
    for earlier, later in itertools.pairwise(records):
        assert later.dispatch_s >= earlier.sent_s
        assert later.scheduled_s == later.dispatch_s  # due when its turn came: a closed loop's next request
    # The emulator's account names each first token by its prompt's head; none was written before its 50 ms.
    assert sorted(tuple(t["prompt_head"]) for t in first_tokens) == [(10 + i,) * 8 for i in range(8)]
    assert all(t["written_s"] - t["handler_start_s"] >= 0.050 for t in first_tokens)


def test_the_send_turn_is_given_back_by_failed_and_cancelled_sends() -> None:
    """Refused connects give the turn back (three sends, three records, no wait on one another's turn), and a
    send cancelled while waiting for its turn is recorded as cancelled, never sent."""

    async def refused_then_cancelled(base_url: str) -> tuple[list[RequestRecord], RequestRecord]:
        settings = ClientSettings(base_url=base_url, model="emulated", connect_timeout_s=2.0)
        prompt = PromptRequest(0, "p", False, 4, [10] * 8, None, False)
        async with StreamingClient(settings, time.perf_counter()) as client:
            refused = await asyncio.wait_for(asyncio.gather(*(client.send(prompt) for _ in range(3))), 10)
            async with client.send_turn.take():  # held: the next send waits for its turn
                waiting = asyncio.create_task(client.send(prompt))
                await asyncio.sleep(0.05)
                waiting.cancel()
                cancelled = await waiting
        return refused, cancelled

    refused, cancelled = asyncio.run(refused_then_cancelled(f"http://127.0.0.1:{free_port()}"))
    assert [r.error_class for r in refused] == [ErrorClass.connection_refused] * 3
    assert cancelled.error_class == ErrorClass.cancelled and cancelled.sent_s is None


def test_an_output_cap_beyond_the_servers_context_is_refused_before_sending(
    inventory_dir: Path, tmp_path: Path
) -> None:
    # The five 40-token prompts (every fourth, from p0003) with 30 output tokens need 70 > 64; the 32-token ones
    # need 62 and would fit, but the run is refused whole, before anything is sent.
    refusal = (r"^max_tokens: inventory emulated-20: 5 prompt\(s\) exceed max_model_len 64 \(prompt \+ max_tokens 30 "
               r"tokens\): p0003 \(40\+30=70\), p0007 \(40\+30=70\)")
    with emulator(max_model_len=64) as base_url, pytest.raises(HarnessError, match=refusal):
        run(inventory_dir, base_url, tmp_path, concurrency=2, max_tokens=30)
    assert not (tmp_path / "requests.jsonl").exists()


def test_max_tokens_below_the_inventorys_caps_is_held_against_the_context_with_its_own_value(
    inventory_dir: Path, tmp_path: Path
) -> None:
    """The fit check, the timeouts and the requests all read the cap the run sends (`--max-tokens`), not the
    inventory's: with the inventory's caps the run could not start, with a lower --max-tokens it fits."""
    # max_model_len 48: the 40-token prompts with the inventory's cap of 11 need 51 > 48, so a run without
    # --max-tokens is refused; with --max-tokens 4 the longest needs 40 + 4 = 44 <= 48 and every request fits;
    # with --max-tokens 9 it needs 49 > 48 and the CLI names the flag.
    with emulator(max_model_len=48) as base_url:
        with pytest.raises(HarnessError, match=r"5 prompt\(s\) exceed max_model_len 48 \(prompt \+ output cap"):
            run(inventory_dir, base_url, tmp_path / "inventory-caps", concurrency=2)
        summary = run(inventory_dir, base_url, tmp_path / "lower", concurrency=2, max_tokens=4)
        refused = CliRunner().invoke(app, ["run", "--inventory", str(inventory_dir), "--out", str(tmp_path / "cli"),
                                           "--base-url", base_url, "--concurrency", "2", "--max-tokens", "9",
                                           "--ready-timeout-s", "20"])
    requests = read_requests(tmp_path / "lower")
    assert summary.requests_ok == len(requests) == 20  # one pass over the 20 prompts, none refused by the server
    assert {request.max_tokens for request in requests} == {4}
    assert {request.output_tokens for request in requests} == {4}
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    assert refused.output.strip().splitlines()[-1].startswith(
        "error: --max-tokens: inventory emulated-20: 5 prompt(s) exceed max_model_len 48 (prompt + max_tokens 9 "
        "tokens): p0003 (40+9=49)")
