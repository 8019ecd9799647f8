"""The capacity search against a dense grid over the same range, on one real CPU engine (the demo's).

The engine is started once, as `harness search` starts it (polyaxonfiles/vllm-service.yaml with the local-cpu
preset: the generated tiny model, 4 MiB of KV cache = 31 usable blocks of 128, max_num_seqs 8, prefix caching
off), and both measure on it with the same probe rules (warm-up wave, 3 turnovers measured, bootstrap
interval, repeats while undecided): the grid every concurrency from 1 to --high in order, the search from
the predicted knee. Printed: each one's answer (the highest load measured to meet the objective below the
first that did not), the probes (runs) each used, how many were invalid, and its wall time; a search that
stopped (a load invalid twice) says why and does not count as agreeing; the target ⌈log2(range)⌉ + 2 probes;
and the predicted knee beside the measured one.

    .venv/bin/python benchmarks/search_efficiency.py [--high 8] [--slo-ttft-ms-p99 400] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.dev.tiny_model import ensure_tiny_model  # noqa: E402
from harness.inventory.frozen import load_inventory  # noqa: E402
from harness.measure.run_options import RunOptions  # noqa: E402
from harness.measure.schedule import LoadShape  # noqa: E402
from harness.search.driver import SearchPlan, SearchTrace, measure_step, run_search  # noqa: E402
from harness.search.facts import Sizing, engine_facts, predicted_knee  # noqa: E402
from harness.search.local import Configuration, LocalProbeRunner, started_engine  # noqa: E402
from harness.search.objective import Decision, PercentileObjective  # noqa: E402
from harness.search.probe import Knob  # noqa: E402

SERVICE = ROOT / "polyaxonfiles" / "vllm-service.yaml"
PRESET = ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"
INVENTORY = ROOT / "prompts" / "tiny-qwen3-600x8"


def grid(plan: SearchPlan, runner: LocalProbeRunner) -> SearchTrace:
    """Every load in order, each decided by the same rules as a search step; the answer is read alike."""
    steps = [measure_step(plan, runner, index + 1, value) for index, value in enumerate(plan.values)]
    return SearchTrace(plan=plan, prediction=None, steps=steps)


def described(name: str, trace: SearchTrace, seconds: float) -> str:
    capacity, short = trace.capacity, trace.first_short
    decisions = ", ".join(f"{step.value:g}:{step.decision.value if step.decision else 'invalid'}"
                          for step in trace.by_value())
    return (f"{name}: capacity {capacity.value:g} " if capacity else f"{name}: no capacity ") + (
        f"(first short {short.value:g}); " if short else "(none short); ") + (
        f"{trace.probes_run} probes over {len(trace.steps)} loads; {seconds:.0f} s; [{decisions}]") + (
        f"\n  stopped: {trace.stopped_reason}" if trace.stopped_reason else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--high", type=int, default=8)
    parser.add_argument("--slo-ttft-ms-p99", type=float, default=400.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="search-efficiency-"))
    os.environ.setdefault("VLLM_API_KEY", secrets.token_hex(16))
    objective = PercentileObjective(latency="ttft", percentile=99, limit_ms=args.slo_ttft_ms_p99)
    values = [float(value) for value in range(1, args.high + 1)]
    configuration = Configuration(index=0, service_files=[SERVICE, PRESET], point={},
                                  params={"model": str(ensure_tiny_model()), "enable_prefix_caching": False})
    options = RunOptions(inventory=INVENTORY, load=LoadShape(concurrency=1), base_url="http://127.0.0.1:1")
    with started_engine(configuration, out) as engine:
        facts = engine_facts(engine, Sizing(inventory=load_inventory(INVENTORY)))
        prediction = predicted_knee(facts, args.high)
        timed = {}
        for name in ("grid", "search"):
            plan = SearchPlan(search_id=name, knob=Knob.CONCURRENCY, values=values, objectives=[objective])
            runner = LocalProbeRunner(engine, options.model_copy(update={"base_url": engine.base_url}), out / name,
                                      project="local/search-efficiency", offline_root=out / "polyaxon")
            started = time.monotonic()
            trace = grid(plan, runner) if name == "grid" else run_search(plan, runner, prediction)
            timed[name] = (trace, time.monotonic() - started)
    print(f"objective {objective.words}; concurrency 1-{args.high}; records in {out}")
    for name, (trace, seconds) in timed.items():
        print(described(name, trace, seconds))
        invalid = sum(bool(probe.invalid_reasons) for step in trace.steps for probe in step.probes)
        print(f"  {invalid} of its runs invalid (each measured once more)")
    target = math.ceil(math.log2(len(values))) + 2
    search, grid_trace = timed["search"][0], timed["grid"][0]
    agree = bool(search.capacity and grid_trace.capacity and search.stopped_reason is None
                 and abs(search.capacity.value - grid_trace.capacity.value) <= 1)
    print(f"target: search within one step of the grid ({'yes' if agree else 'no'}) in at most "
          f"⌈log2 {len(values)}⌉ + 2 = {target} probes ({'yes' if search.probes_run <= target else 'no'})")
    measured = grid_trace.first_short.value if grid_trace.first_short else None
    knee = prediction.knee_concurrency
    within = measured is not None and knee is not None and abs(measured - knee) <= 1
    print(f"predicted knee {knee} ({prediction.bound_by.value}); measured knee (the grid's first load short) "
          f"{measured if measured is None else f'{measured:g}'}: within one step {'yes' if within else 'no'}")
    undecided = [step.value for step in grid_trace.steps if step.decision == Decision.UNDECIDED]
    if undecided:
        print(f"grid loads left undecided after their repeats: {undecided}")


if __name__ == "__main__":
    main()
