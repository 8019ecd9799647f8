"""Loop stalls on a busy machine: short emulated runs beside busy processes, judged by the stall rule.

Each round starts `--loops-per-core` busy Python processes per core (at the harness's own priority, each
ending by itself), then makes `--runs` runs of the kind the tests make (8 requests at concurrency 4 against
`harness emulate` with 20 ms to the first token and 20 ms between tokens, about 0.4 s each) in this process.
The loop probe's ticks are kept by a subclass put in the runner's place, so every run's lateness is printed
in full: its probed time, its stalled time (each tick's lateness past the 10 ms floor, summed), its
latest tick, and whether it is stalled by a twentieth of the probed time alone and by the harness's rule
(more than the larger of a twentieth and MIN_LOOP_STALLED_MS). Last, per round, how many runs each rule
calls stalled and the latest single tick seen.

    .venv/bin/python benchmarks/loop_stalls.py [--loops-per-core 0 1 2] [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import harness.measure.runner as runner
from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange, write_inventory
from harness.loopback import free_port
from harness.measure.loop_lag import LoopLagProbe
from harness.measure.ready import wait_until_healthy
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.schedule import LoadShape
from harness.measure.stats import LOOP_LAG_FLOOR_MS, MAX_LOOP_STALL_SHARE, loop_probed_ms, max_loop_stall_share

import harness_drivers

HARNESS = str(Path(sys.executable).with_name("harness"))
probes: list[LoopLagProbe] = []


class KeptProbe(LoopLagProbe):
    """The runner's probe, kept after its run so its ticks can be read."""

    def __init__(self, *args: float) -> None:
        super().__init__(*args)
        probes.append(self)


def run_once(inventory_dir: Path, base_url: str, out: Path) -> list[float]:
    """One short run; the loop probe's lateness per tick."""
    config, inventory = build_run_config(RunOptions(inventory=inventory_dir, base_url=base_url, max_tokens=10,
                                                    load=LoadShape(concurrency=4, requests=8), sample_interval_s=0.2))
    runner.run_load(config, inventory, out, ready_timeout_s=20)
    return probes[-1].lags_ms


def judged_rounds(loops_per_core: list[int], runs: int, work: Path) -> None:
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=10, high=1900), prompt_tokens=[16, 24, 32, 40] * 2,
                           output_cap_tokens=[10] * 8, seed=0)
    inventory_dir = write_inventory(build_token_id_inventory("stalls-8", recipe), work / "inventory")
    port = free_port()
    emulator = subprocess.Popen([HARNESS, "emulate", "--port", str(port), "--ttft-ms", "20", "--itl-ms", "20"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    try:
        if wait_until_healthy(base_url, 20, process=emulator, poll_s=0.05, request_timeout_s=1) != "healthy":
            raise SystemExit("the emulator did not start")
        for per_core in loops_per_core:
            judged_round(per_core, runs, inventory_dir, base_url, work / f"busy-{per_core}")
    finally:
        emulator.send_signal(signal.SIGTERM)
        emulator.wait(timeout=10)


def judged_round(per_core: int, runs: int, inventory_dir: Path, base_url: str, work: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    loops = [subprocess.Popen(harness_drivers.argv("busy-loop", str(10 + 3 * runs)))
             for _ in range(per_core * cores)]
    print(f"beside {per_core} busy loop(s) per core ({len(loops)} on {cores} cores):")
    print("  probed_ms  stalled_ms  loop_lag_ms_max  share   past 5 %  past the rule")
    worst_ms, by_share, by_rule = 0.0, 0, 0
    try:
        for index in range(runs):
            lags_ms = run_once(inventory_dir, base_url, work / f"run-{index}")
            probed_ms = loop_probed_ms(lags_ms)
            stalled_ms = sum(max(0.0, lag - LOOP_LAG_FLOOR_MS) for lag in lags_ms)
            share = stalled_ms / probed_ms
            past_share, past_rule = share > MAX_LOOP_STALL_SHARE, share > max_loop_stall_share(probed_ms)
            worst_ms, by_share, by_rule = max(worst_ms, max(lags_ms)), by_share + past_share, by_rule + past_rule
            print(f"  {probed_ms:9.0f}  {stalled_ms:10.1f}  {max(lags_ms):15.1f}  {share:.3f}  "
                  f"{'yes' if past_share else 'no':>8}  {'yes' if past_rule else 'no':>13}")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait(timeout=10)
    print(f"  stalled past 5 %: {by_share} of {runs}; past the rule: {by_rule} of {runs}; "
          f"latest tick {worst_ms:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops-per-core", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    runner.LoopLagProbe = KeptProbe  # type: ignore[misc, assignment]
    with tempfile.TemporaryDirectory() as work:
        judged_rounds(args.loops_per_core, args.runs, Path(work))


if __name__ == "__main__":
    main()
