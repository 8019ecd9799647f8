"""Client overhead: this harness against `vllm bench serve`, same emulated server, same workload.

For each stream count the two clients run alternately (a few rounds, order flipped each round) against
one emulator process, each client in its own process (with --pin: clients on one core, the emulator on
another). Printed per stream count: each tool's achieved chunks/s and client CPU time (user + sys) per
1,000 streamed chunks, the harness/vLLM CPU ratio, TTFT and ITL error against the emulator's configured
values (p50/p99; this harness's and, for comparison, `vllm bench serve`'s own), the emulator's CPU use
(near 100 % means the emulator, not the client, set the achieved rate), and the TTFT error of the first
wave alone (the first request of every stream, all opened at the load's zero). The streams stay in step
(same lengths, same timing), so every later wave is a burst of sends too, made of streams that ended
together: there each send waits for the client's send work on the streams before it.

The harness's TTFT error is split by the emulator's account of each first token it wrote: the client's
share (its send delay, dispatch to the request's last byte written, plus its read delay, the emulator's
write to the client's read) and the server's share (the request's bytes leaving to the emulator's write,
less the configured TTFT). A client that sent and read in no time would still measure the server's share.

    .venv/bin/python benchmarks/client_overhead.py [--streams 16 64 256] [--rounds 2] [--pin]
        [--harness-processes N]

--harness-processes spreads the harness's streams evenly over N processes, each with its own prompts,
and pools their figures: whether worker processes help when the clients share one core.

`vllm bench serve` is driven through `vllm.benchmarks.serve.benchmark` from the engine's venv
($HARNESS_ENGINE_VENV, default ~/.cache/vllm-serving-harness/engine-venv): its console script fails
in the CPU build. CPU time is measured around each tool's run only, so imports and one-time library
start-up do not count.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange, write_inventory
from harness.loopback import free_port
from harness.measure.ready import wait_until_healthy
from harness.measure.record import read_requests
from harness.schema import RunFile

import harness_drivers

ENGINE_VENV = Path(os.environ.get("HARNESS_ENGINE_VENV", Path.home() / ".cache/vllm-serving-harness/engine-venv"))
HARNESS = str(Path(sys.executable).with_name("harness"))
VLLM_DRIVERS = Path(__file__).with_name("vllm_drivers.py")  # run by the engine's interpreter, never imported
PROMPT_HEAD = 8  # the emulator names each first token it wrote by its prompt's first 8 token ids


def pinned(cpu: int | None) -> Callable[[], None] | None:
    """A preexec function that pins the child to one core (when the machine has more than one)."""
    return (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None


def process_cpu_s(pid: int) -> float:
    """user + sys of a running process, from /proc (the emulator lives across trials)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_emulator(args: argparse.Namespace, cpu: int | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        HARNESS, "emulate", "--port", str(port), "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
        "--max-num-seqs", "4096", "--kv-capacity-tokens", "100000000",
    ]
    # open to every client: `vllm bench serve` sends no key, and what is measured here is the client alone
    open_env = {name: value for name, value in os.environ.items() if name != "VLLM_API_KEY"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, preexec_fn=pinned(cpu), env=open_env)
    base_url = f"http://127.0.0.1:{port}"
    if wait_until_healthy(base_url, 10, process=process, poll_s=0.05, request_timeout_s=1) == "healthy":
        return process, base_url
    process.kill()
    raise SystemExit("emulator did not start")


def run_tool(commands: list[list[str]], cpu: int | None, emulator: subprocess.Popen, base_url: str) -> list[dict]:
    """Runs the commands at once (the processes of one client); each prints its result as its last line."""
    httpx.post(f"{base_url}/emulator/lateness")  # forget first tokens written before this trial
    emulator_cpu, started = process_cpu_s(emulator.pid), time.perf_counter()
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pinned(cpu))
        for command in commands
    ]
    results = []
    for command, process in zip(commands, processes, strict=True):
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            raise SystemExit(f"{command[0]} failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    emulator_cpu_fraction = (process_cpu_s(emulator.pid) - emulator_cpu) / (time.perf_counter() - started)
    account = httpx.post(f"{base_url}/emulator/lateness").json()
    written_s = {tuple(token["prompt_head"]): token["written_s"] for token in account["first_tokens"]}
    for result in results:
        result.update(emulator_cpu_fraction=emulator_cpu_fraction, written_s=written_s)
    return results


def spec_file(spec: dict, path: Path) -> str:
    path.write_text(json.dumps(spec))
    return str(path)


def harness_trial(spec: dict, out: Path, cpu: int | None, emulator: subprocess.Popen, args, heads: list[dict]) -> dict:
    """The harness's streams, split evenly over `args.harness_processes` processes, each with its own
    prompts; their results are pooled as one client's."""
    processes, start_at_unix_s = args.harness_processes, time.time() + 3.0  # past every process's imports
    specs = [
        {**spec, "inventory": str(inventory), "out": str(out / str(k)), "streams": spec["streams"] // processes,
         "requests": spec["requests"] // processes, "start_at_unix_s": start_at_unix_s}
        for k, inventory in enumerate(spec["harness_inventories"])
    ]
    out.mkdir()
    commands = [harness_drivers.argv("harness-run", spec_file(s, out / f"{k}.json")) for k, s in enumerate(specs)]
    results = run_tool(commands, cpu, emulator, spec["base_url"])
    parts = [process_figures(*each, args) for each in zip(specs, results, heads, strict=True)]
    pooled = {key: [value for part in parts for value in part[key]] for key in parts[0]}
    return {
        **pooled, "cpu_s": sum(r["cpu_s"] for r in results), "wall_s": max(r["wall_s"] for r in results),
        "chunks": sum(pooled.pop("chunks_per_request")), "emulator_cpu_fraction": results[0]["emulator_cpu_fraction"],
    }


def process_figures(spec: dict, result: dict, heads: dict, args) -> dict[str, list[float]]:
    """One harness process's errors and delays, from its records, on the clock the emulator stamped its
    writes with."""
    out = Path(spec["out"])
    records = [r for r in read_requests(out) if r.error_class is None]
    sent_s = [r.sent_s for r in records if r.sent_s is not None]
    first_token_s = [r.first_token_s for r in records if r.first_token_s is not None]
    assert len(sent_s) == len(first_token_s) == len(records)  # a request without an error was sent and answered
    # The run's times on the machine's monotonic clock, where the emulator stamped its writes.
    zero_s = json.loads((out / RunFile.CONFIG).read_text())["clock_zero_unix_s"] - result["unix_minus_monotonic_s"]
    written = [result["written_s"][heads[r.prompt_id]] - zero_s for r in records]
    by_schedule = sorted(zip(records, first_token_s, strict=True), key=lambda pair: pair[0].scheduled_s)
    first_wave = by_schedule[: spec["streams"]]
    return {
        "chunks_per_request": [len(r.chunk_times_s) for r in records],
        "ttft_error_ms": [(first - r.scheduled_s) * 1000 - args.ttft_ms
                          for r, first in zip(records, first_token_s, strict=True)],
        "read_delay_ms": [(first - w) * 1000 for first, w in zip(first_token_s, written, strict=True)],
        "client_share_ms": [
            (sent - r.scheduled_s + first - w) * 1000
            for r, sent, first, w in zip(records, sent_s, first_token_s, written, strict=True)
        ],
        "server_share_ms": [(w - sent) * 1000 - args.ttft_ms for sent, w in zip(sent_s, written, strict=True)],
        "first_wave_ttft_error_ms": [(first - r.scheduled_s) * 1000 - args.ttft_ms for r, first in first_wave],
        "itl_error_ms": [
            (later - earlier) * 1000 / tokens - args.itl_ms
            for r in records
            # one token count per chunk time, so both sides have one entry per gap
            for (earlier, later), tokens in zip(itertools.pairwise(r.chunk_times_s), r.chunk_tokens[1:], strict=True)
        ],
    }


def vllm_trial(spec: dict, cpu: int | None, emulator: subprocess.Popen, work: Path) -> dict:
    python = str(ENGINE_VENV / "bin" / "python")
    command = [python, str(VLLM_DRIVERS), "client-overhead", spec_file(spec, work / "vllm-spec.json")]
    [result] = run_tool([command], cpu, emulator, spec["base_url"])
    result["read_delay_ms"] = [
        (read - result["written_s"][tuple(ids[:PROMPT_HEAD])]) * 1000
        for ids, read in zip(spec["prompts"], result.pop("first_token_read_s"), strict=True) if read is not None
    ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--min-requests", type=int, default=256, help="per trial, so few streams still stream enough")
    parser.add_argument("--pin", action="store_true", help="emulator on the first core, clients on the second")
    parser.add_argument("--harness-processes", type=int, default=1,
                        help="spread the harness's streams over this many processes (on the clients' core with --pin)")
    args = parser.parse_args()
    if uneven := [streams for streams in args.streams if streams % args.harness_processes]:
        parser.error(f"--streams {uneven[0]} does not split evenly over --harness-processes {args.harness_processes}")

    cores = sorted(os.sched_getaffinity(0))
    emulator_cpu, client_cpu = (cores[0], cores[1]) if args.pin and len(cores) > 1 else (None, None)
    work = Path(tempfile.mkdtemp(prefix="client-overhead-"))
    most_requests = max(max(args.streams) * args.requests_per_stream, args.min_requests)
    recipe = TokenIdRecipe(
        vocabulary=VocabularyRange(low=10, high=1900),
        prompt_tokens=[args.prompt_tokens] * most_requests,
        output_cap_tokens=[args.output_tokens] * most_requests,
        seed=0,
    )
    # One inventory per harness process, so the emulator's account names each first token's request; vLLM's
    # tool sends the first.
    inventories = [
        build_token_id_inventory(f"client-overhead-{k}", recipe.model_copy(update={"seed": k}))
        for k in range(args.harness_processes)
    ]
    inventory_dirs = [write_inventory(inventory, work / f"inventory-{k}") for k, inventory in enumerate(inventories)]
    heads = [{p.prompt_id: tuple((p.token_ids or [])[:PROMPT_HEAD]) for p in inventory.prompts}  # token-id prompts
             for inventory in inventories]
    emulator, base_url = start_emulator(args, emulator_cpu)
    pinning = f"emulator cpu {emulator_cpu}, clients cpu {client_cpu}" if client_cpu is not None else "no"
    print(f"emulator: TTFT {args.ttft_ms} ms, ITL {args.itl_ms} ms, 1 token per chunk; "
          f"{args.prompt_tokens} prompt + {args.output_tokens} output tokens; "
          f"{args.requests_per_stream} requests per stream (at least {args.min_requests}); {args.rounds} rounds; "
          f"pinned: {pinning}")
    rows = []
    try:
        for streams in args.streams:
            requests = max(streams * args.requests_per_stream, args.min_requests)
            spec = {
                "base_url": base_url, "streams": streams, "requests": requests,
                "output_tokens": args.output_tokens, "harness_inventories": [str(d) for d in inventory_dirs],
                "ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms,
                "prompts": [p.token_ids for p in inventories[0].prompts[:requests]],
            }
            trials: dict[str, list[dict]] = {"harness": [], "vllm": []}
            for round_index in range(args.rounds):
                order = ["harness", "vllm"] if round_index % 2 == 0 else ["vllm", "harness"]
                for tool in order:
                    if tool == "harness":
                        out = work / f"run-{streams}-{round_index}"
                        trials[tool].append(harness_trial(spec, out, client_cpu, emulator, args, heads))
                    else:
                        trials[tool].append(vllm_trial(spec, client_cpu, emulator, work))
            rows.append((streams, trials))
    finally:
        emulator.terminate()
        emulator.wait()
    print_table(rows)


def print_table(rows: list[tuple[int, dict[str, list[dict]]]]) -> None:
    def per_1000(trials: list[dict]) -> float:
        return 1e6 * sum(t["cpu_s"] for t in trials) / sum(t["chunks"] for t in trials)

    def rate(trials: list[dict]) -> str:
        return f"{sum(t['chunks'] for t in trials) / sum(t['wall_s'] for t in trials):,.0f}"

    def error(trials: list[dict], key: str) -> str:
        p50, p99 = np.percentile([e for t in trials for e in t[key]], [50, 99])
        return f"{p50:.2f}/{p99:.2f}"

    def table(title: str, columns: list[str], cells: Callable[[list[dict], list[dict]], list[str]]) -> Table:
        shown = Table(title=title)
        for column in ["streams", *columns]:
            shown.add_column(column, justify="right")
        for streams, trials in rows:
            shown.add_row(str(streams), *cells(trials["harness"], trials["vllm"]))
        return shown

    console = Console(width=160)
    console.print(table(
        "Throughput and client CPU",
        ["chunks/s harness", "vllm", "cpu ms/1k chunks harness", "vllm", "ratio", "emulator cpu %",
         "itl err ms p50/p99 harness", "vllm"],
        lambda harness, vllm: [
            rate(harness), rate(vllm), f"{per_1000(harness):.1f}", f"{per_1000(vllm):.1f}",
            f"{per_1000(harness) / per_1000(vllm):.2f}",
            f"{100 * max(t['emulator_cpu_fraction'] for t in harness + vllm):.0f}",
            error(harness, "itl_error_ms"), error(vllm, "itl_error_ms"),
        ],
    ))
    console.print(table(
        "TTFT error, ms p50/p99: measured TTFT - configured TTFT. The harness's split: client = its send delay + "
        "its read delay; server = from its bytes leaving to the emulator's first-token write",
        ["ttft err harness", "vllm", "client share", "server share", "read delay harness", "vllm",
         "first wave ttft err harness", "vllm"],
        lambda harness, vllm: [
            error(harness, "ttft_error_ms"), error(vllm, "ttft_error_ms"), error(harness, "client_share_ms"),
            error(harness, "server_share_ms"), error(harness, "read_delay_ms"), error(vllm, "read_delay_ms"),
            error(harness, "first_wave_ttft_error_ms"), error(vllm, "first_wave_ttft_error_ms"),
        ],
    ))


if __name__ == "__main__":
    main()
