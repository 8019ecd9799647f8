"""Programs the benchmarks start in a child harness interpreter, as a module lint and type checks read.

`python benchmarks/harness_drivers.py NAME [ARGS...]`; `argv(NAME, ...)` builds that command line. The vLLM
side's programs, which run under the engine's interpreter, are in benchmarks/vllm_drivers.py.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape


def argv(name: str, *args: str) -> list[str]:
    """The command line that runs program `name` under this interpreter."""
    return [sys.executable, __file__, name, *args]


def busy_loop(seconds: str) -> None:
    """Spend a core for `seconds`, then end by itself."""
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        pass


def harness_run(spec_path: str) -> None:
    """One harness process of a client-overhead trial: the load its spec names, timed; prints CPU and wall time."""
    # One-time library start-up before timing, as vLLM's driver imports its modules before timing:
    # pandas/pyarrow spend ~50 ms of CPU on their first Parquet write whatever its size.
    pd.DataFrame({"warm": [[1.0]]}).to_parquet(io.BytesIO())
    spec = json.loads(Path(spec_path).read_text())
    config, inventory = build_run_config(RunOptions(
        inventory=Path(spec["inventory"]), base_url=spec["base_url"], max_tokens=spec["output_tokens"],
        load=LoadShape(concurrency=spec["streams"], requests=spec["requests"]),
    ))
    time.sleep(max(0.0, spec["start_at_unix_s"] - time.time()))  # processes of one trial start together
    cpu, wall = time.process_time(), time.perf_counter()
    run_load(config, inventory, Path(spec["out"]), ready_timeout_s=30)
    print(json.dumps({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
                      "unix_minus_monotonic_s": time.time() - time.perf_counter()}))


PROGRAMS: dict[str, Callable[..., None]] = {"busy-loop": busy_loop, "harness-run": harness_run}

if __name__ == "__main__":
    PROGRAMS[sys.argv[1]](*sys.argv[2:])
