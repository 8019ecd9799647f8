"""Agreement with `vllm bench serve`: both tools, in alternation, against one real CPU engine.

The engine is started once, as the project starts it (polyaxonfiles/vllm-service.yaml with the local-cpu
preset, through `harness.launch.engine_process.local_engine`, serving the generated tiny model), so it runs
with whatever CPU placement the preset and the launcher give it; the two clients get none of their own. Each
round runs `harness run` and `vllm bench serve` one after the other (order flipped each round) with the same
token-id prompts, the same concurrency, the same output length (ignore_eos, same max_tokens, temperature 0),
the same stream options (usage on every chunk) and the same number of warm-up requests. 512 prompts by
default: a p99 over 128 requests is the second-slowest one, and moves by tens of percent between rounds.
Printed: each tool's TTFT mean (beside the engine's own, see below), TTFT/TPOT/ITL/E2E p50 and p99 and
output tok/s as the median over rounds with the round-to-round min–max and relative spread ((max − min) /
median), how far the two medians are apart, and the share of token gaps over 1 ms ("paced"); then per
round, the harness's run id, the engine's generated tokens and prefix-cache hits over each tool's run
(from /metrics), the longest time no stream heard a token while one was open (`stream_silence_s_max`:
a round whose server stopped shows it here), and the share of its run the harness's own /metrics scrapes
held the API server, which streams nothing meanwhile: vLLM's tool does not scrape, so the harness (every 5 s
by default) loads the server a little more; `--harness-sample-interval-s 600` leaves it the scrapes
before and after the load.
Each round also says the engine's own mean inter-token latency over each tool's run (vLLM's histogram: a
spread the engine shares is the machine's or the server's, not the tool's), the CPU time each tool's process
used (imports included: about 0.6 s for the harness, 11 s for vLLM's, which loads torch), the machine's
load average as the run ended, and why a harness run was invalid (an invalid run is kept as a round: on a
shared machine it is often the finding). `--client-cpus 1` starts both clients on core 1 only, the API
server's, away from the worker's.

    .venv/bin/python benchmarks/agreement.py [--rounds 3] [--concurrency 8] [--prompts 512]
        [--harness-sample-interval-s 5] [--client-cpus 1]

How each tool defines its figures (both time from just before the request is written):
- TTFT: harness, the first chunk that carries a token (token counts from continuous usage stats);
  vLLM, the first chunk that has `choices` (its text may be empty).
- TPOT: harness, (last token chunk − first token chunk) / (output tokens − 1); vLLM, (E2E − TTFT) /
  (output tokens − 1), its E2E ending after the usage chunk and [DONE].
- ITL: harness, per token: a chunk of k tokens after a gap g gives k gaps of g/k; vLLM, per chunk: the gap
  before each chunk after the first, whatever it carries.
- E2E: harness, until the stream is closed; vLLM, until the stream ends.
- Output tok/s: harness, output tokens / (first scheduled send → last request's end); vLLM, output tokens
  (from usage) / the whole main run's duration.
- Paced share (computed here, the same way for both): inter-chunk gaps over 1 ms / (output tokens − 1),
  over every measured request: 1.0 when every token arrived on its own, near 0 when tokens came in bursts.
- Engine TTFT mean: vLLM's own TTFT histogram (time_to_first_token_seconds: sum and count grown between a
  scrape before and one after each tool's run, its warm-up requests included), timed inside vLLM from the
  request's arrival there. The client's mean TTFT minus it is what lies outside vLLM's stamp: HTTP, the
  API server taking the request in, the client. A round-to-round spread the engine's own figure shares
  is the server's, not the tool's.

`vllm bench serve`'s own datasets send text (its random dataset decodes the token ids it draws; custom reads
text), so the same token ids are given to `vllm.benchmarks.serve.benchmark`, the coroutine its CLI runs, from
the engine's venv: the CLI's console script fails in the CPU build. It is given the model's tokenizer only
because it reports TTFT, TPOT and ITL only when it has one; output tokens still come from the server's usage.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.dev.tiny_model import SPECIAL_TOKENS, VOCAB_SIZE, ensure_tiny_model
from harness.errors import EXIT_INVALID
from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange, write_inventory
from harness.launch.engine_process import engine_python, local_engine
from harness.measure.client import RequestRecord
from harness.measure.record import read_requests
from harness.observe.server_metrics import MetricsSnapshot, parse_metrics
from harness.redact import redact_argv
from harness.server_auth import auth_headers

REPO = Path(__file__).resolve().parent.parent
SERVICE = [REPO / "polyaxonfiles" / "vllm-service.yaml", REPO / "polyaxonfiles" / "presets" / "local-cpu.yaml"]
HARNESS = str(Path(sys.executable).with_name("harness"))
VLLM_DRIVERS = Path(__file__).with_name("vllm_drivers.py")  # run by the engine's interpreter, never imported
PACED_GAP_S = 0.001
# What the harness asks for (harness.measure.client.request_body): usage on every chunk costs the API server work
# per token, and the API server is the busy part here, so vLLM's tool is given the same.
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}

# (row name, harness summary key, vLLM result key); a trial's figures are keyed by row name, and the rows
# without keys are filled from the engine's /metrics (`counted`)
FIGURES = [
    ("ttft_ms_mean", "ttft_ms_mean", "mean_ttft_ms"),
    ("engine_ttft_ms_mean", None, None),
    ("ttft_outside_engine_ms_mean", None, None),
    ("engine_itl_ms_mean", None, None),
    ("ttft_ms_p50", "ttft_ms_p50", "p50_ttft_ms"),
    ("ttft_ms_p99", "ttft_ms_p99", "p99_ttft_ms"),
    ("tpot_ms_p50", "tpot_ms_p50", "p50_tpot_ms"),
    ("tpot_ms_p99", "tpot_ms_p99", "p99_tpot_ms"),
    ("itl_ms_p50", "itl_ms_p50", "p50_itl_ms"),
    ("itl_ms_p99", "itl_ms_p99", "p99_itl_ms"),
    ("e2e_ms_p50", "e2e_ms_p50", "p50_e2el_ms"),
    ("e2e_ms_p99", "e2e_ms_p99", "p99_e2el_ms"),
    ("output_tokens_per_s", "output_tokens_per_s", "output_throughput"),
    ("paced_gap_share", "paced_gap_share", "paced_gap_share"),
]


@dataclass
class Trial:
    """One tool's run in one round: its figures, and what the engine's counters say it asked for."""

    tool: str
    round_index: int
    figures: dict[str, float]
    generated_tokens: int | None = None
    prefix_cache_hits_tokens: int | None = None
    run_id: str | None = None
    scrape_share: float | None = None  # the harness's: how long its /metrics scrapes held the server
    output_tokens: set[int] = field(default_factory=set)
    invalid_reasons: list[str] = field(default_factory=list)  # the harness's, when its run was invalid
    load_average: float | None = None  # the machine's 1-minute load average as the trial ended
    client_cpu_s: float | None = None  # CPU time (user + system) the tool's own process used
    silence_s: float | None = None  # the harness's: the longest time no stream heard a token while one was open


def paced_share(gaps_per_request: list[list[float]], tokens_per_request: list[int]) -> float:
    """Inter-chunk gaps over 1 ms per token gap: a burst of k tokens in one read counts as k − 1 unpaced."""
    paced = sum(sum(gap > PACED_GAP_S for gap in gaps) for gaps in gaps_per_request)
    return paced / sum(tokens - 1 for tokens in tokens_per_request)


def chunk_gaps_s(record: RequestRecord) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(record.chunk_times_s)]


def client_placement(args: argparse.Namespace) -> Callable[[], None] | None:
    """Both tools' processes on `--client-cpus` when given (set before they start, so every thread has it)."""
    cpus = {int(cpu) for cpu in args.client_cpus.split(",")} if args.client_cpus else None
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def children_cpu_s() -> float:
    """CPU time used so far by this process's finished children: a trial's client is the one that just ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def scrape(base_url: str) -> MetricsSnapshot:
    return parse_metrics(httpx.get(f"{base_url}/metrics", timeout=10).text)


def counted(trial: Trial, before: MetricsSnapshot, after: MetricsSnapshot) -> None:
    """The engine's own account of the trial: tokens generated and prefix-cache hits in between, and its
    mean TTFT from vLLM's histogram, so that the client's mean TTFT splits into the engine's and the rest."""
    if after.generation_tokens_total is not None and before.generation_tokens_total is not None:
        trial.generated_tokens = after.generation_tokens_total - before.generation_tokens_total
    if after.prefix_cache_hits_total is not None and before.prefix_cache_hits_total is not None:
        trial.prefix_cache_hits_tokens = after.prefix_cache_hits_total - before.prefix_cache_hits_total
    ttft_before, ttft_after = before.time_to_first_token_seconds, after.time_to_first_token_seconds
    if ttft_before is not None and ttft_after is not None and ttft_after.count > ttft_before.count:
        engine_ms = 1000 * (ttft_after.sum - ttft_before.sum) / (ttft_after.count - ttft_before.count)
        trial.figures["engine_ttft_ms_mean"] = engine_ms
        trial.figures["ttft_outside_engine_ms_mean"] = trial.figures["ttft_ms_mean"] - engine_ms
    itl_before, itl_after = before.inter_token_latency_seconds, after.inter_token_latency_seconds
    if itl_before is not None and itl_after is not None and itl_after.count > itl_before.count:
        tokens = itl_after.count - itl_before.count
        trial.figures["engine_itl_ms_mean"] = 1000 * (itl_after.sum - itl_before.sum) / tokens


def harness_trial(args: argparse.Namespace, base_url: str, inventory: Path, out: Path, round_index: int) -> Trial:
    command = [
        HARNESS, "run", "--inventory", str(inventory), "--out", str(out), "--base-url", base_url,
        "--concurrency", str(args.concurrency), "--max-tokens", str(args.output_tokens),
        "--warmup", str(args.warmup), "--ready-timeout-s", "60", "--sample-interval-s",
        str(args.harness_sample_interval_s),
    ]
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=client_placement(args))
    if done.returncode not in (0, EXIT_INVALID):  # an invalid run is a round too: its reasons are printed
        raise SystemExit(f"harness run failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    measured = [r for r in read_requests(out) if not r.warmup and r.error_class is None]
    figures = {row: summary["latency"][key] for row, key, _ in FIGURES if key in summary["latency"]}
    figures["output_tokens_per_s"] = summary["output_tokens_per_s"]
    figures["paced_gap_share"] = paced_share(
        [chunk_gaps_s(r) for r in measured], [sum(r.chunk_tokens) for r in measured]
    )
    run_id = json.loads((out / "config.json").read_text())["run_id"]
    output_tokens = {r.output_tokens for r in measured if r.output_tokens is not None}
    return Trial("harness", round_index, figures, run_id=run_id, output_tokens=output_tokens,
                 scrape_share=summary["scrape"]["scrape_share"], invalid_reasons=summary["invalid_reasons"],
                 silence_s=summary["pacing"]["stream_silence_s_max"])


def vllm_trial(args: argparse.Namespace, base_url: str, spec: dict, work: Path, round_index: int) -> Trial:
    spec_path, result_path = work / "vllm-spec.json", work / f"vllm-result-{round_index}.json"
    spec_path.write_text(json.dumps({**spec, "base_url": base_url}))
    command = [str(engine_python()), str(VLLM_DRIVERS), "agreement", str(spec_path), str(result_path)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{done.stderr[-3000:]}")
    result = json.loads(result_path.read_text())
    figures = {row: result["figures"][key] for row, _, key in FIGURES if key in result["figures"]}
    figures["paced_gap_share"] = paced_share(result["itls_s"], result["output_tokens"])
    return Trial("vllm", round_index, figures, output_tokens=set(result["output_tokens"]))


def relative_spread(values: list[float], median: float) -> float:
    """(max − min) / median; unbounded when the median is 0 and the rounds differ (ITL p50 of burst rounds)."""
    width = max(values) - min(values)
    return width / abs(median) if median else (math.inf if width else 0.0)


def agreement_table(trials: list[Trial]) -> Table:
    table = Table(title=escape("harness run vs vllm bench serve: median over rounds [min–max] (relative spread)"))
    table.add_column("figure")
    for tool in ("harness", "vllm bench serve"):
        table.add_column(tool, justify="right")
    table.add_column("medians apart", justify="right")
    table.add_column("within spread", justify="center")
    for row, _, _ in FIGURES:
        if any(row not in t.figures for t in trials if t.tool in ("harness", "vllm")):
            continue
        per_tool = [
            [t.figures[row] for t in trials if t.tool == tool]
            for tool in ("harness", "vllm")
        ]
        medians = [float(np.median(values)) for values in per_tool]
        spreads = [relative_spread(values, median) for values, median in zip(per_tool, medians, strict=True)]
        cells = [
            escape(f"{median:,.3f} [{min(values):,.3f}–{max(values):,.3f}] ({spread:.0%})")
            for values, median, spread in zip(per_tool, medians, spreads, strict=True)
        ]
        apart = abs(medians[0] - medians[1]) / max(abs(medians[1]), 1e-9)
        table.add_row(row, *cells, f"{apart:.0%}", "yes" if apart <= max(spreads) else "no")
    return table


def rounds_table(trials: list[Trial]) -> Table:
    table = Table(title="rounds, in the order they ran")
    for name in ("round", "tool", "harness run id", "output tokens per request", "engine generated tokens",
                 "prefix-cache hits (tokens)", "scrape share", "longest silence s", "client CPU s", "load average",
                 "invalid"):
        table.add_column(name)
    for t in trials:
        table.add_row(
            str(t.round_index), t.tool, t.run_id or "-", ",".join(map(str, sorted(t.output_tokens))),
            str(t.generated_tokens), str(t.prefix_cache_hits_tokens),
            "-" if t.scrape_share is None else f"{t.scrape_share:.4f}",
            "-" if t.silence_s is None else f"{t.silence_s:.3f}",
            "-" if t.client_cpu_s is None else f"{t.client_cpu_s:.1f}",
            "-" if t.load_average is None else f"{t.load_average:.2f}", escape("; ".join(t.invalid_reasons)) or "-",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8, help="warm-up requests per tool per round, not measured")
    parser.add_argument("--harness-sample-interval-s", type=float, default=5.0,
                        help="the harness's /metrics interval (5 s is its default); vLLM's tool does not scrape")
    parser.add_argument("--client-cpus", default=None,
                        help="run both clients on these cores (e.g. 1: the API server's, away from the worker's)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="agreement-"))
    os.environ.setdefault("VLLM_API_KEY", secrets.token_hex(16))  # the engine refuses to start unauthenticated
    recipe = TokenIdRecipe(
        vocabulary=VocabularyRange(low=0, high=VOCAB_SIZE - len(SPECIAL_TOKENS)),
        prompt_tokens=[args.prompt_tokens] * args.prompts,
        output_cap_tokens=[args.output_tokens] * args.prompts,
        seed=0,
    )
    inventory = build_token_id_inventory("agreement", recipe)
    inventory_dir = write_inventory(inventory, work / "inventory")
    model = ensure_tiny_model(seed=0)
    console = Console(width=160)
    trials: list[Trial] = []
    with local_engine(SERVICE, {"model": str(model)}, log_path=work / "engine.log") as engine:
        served = httpx.get(f"{engine.base_url}/v1/models", headers=auth_headers(), timeout=10).json()["data"][0]["id"]
        spec = {
            "model": served, "tokenizer": str(model), "prompts": [p.token_ids for p in inventory.prompts],
            "output_tokens": args.output_tokens, "concurrency": args.concurrency, "warmup": args.warmup,
            "stream_options": STREAM_OPTIONS,
        }
        console.print(
            f"engine: {' '.join(redact_argv(engine.argv[1:]))}\n{args.prompts} prompts of {args.prompt_tokens} tokens, "
            f"{args.output_tokens} output tokens (ignore_eos), concurrency {args.concurrency}, "
            f"{args.warmup} warm-up requests per run, {args.rounds} rounds; load average at start "
            f"{os.getloadavg()[0]:.2f}; work dir {work}"
        )
        for round_index in range(args.rounds):
            order = ["harness", "vllm"] if round_index % 2 == 0 else ["vllm", "harness"]
            for tool in order:
                before, cpu_before_s = scrape(engine.base_url), children_cpu_s()
                if tool == "harness":
                    run_dir = work / f"run-{round_index}"
                    trial = harness_trial(args, engine.base_url, inventory_dir, run_dir, round_index)
                else:
                    trial = vllm_trial(args, engine.base_url, spec, work, round_index)
                counted(trial, before, scrape(engine.base_url))
                trial.load_average, trial.client_cpu_s = os.getloadavg()[0], children_cpu_s() - cpu_before_s
                trials.append(trial)
    console.print(f"load average at end {os.getloadavg()[0]:.2f}")
    console.print(agreement_table(trials))
    console.print(rounds_table(trials))


if __name__ == "__main__":
    main()
