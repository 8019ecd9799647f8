"""The analysis-at-scale benchmark writes records in the current on-disk format and reads them back: a record
field added without the benchmark knowing fails here, not on the day someone measures."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "analysis_scale.py"


def test_the_benchmark_reads_back_three_small_runs() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "3", "--requests", "50"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "analysis_total_s" in done.stdout and "for 3 runs, 3 points" in done.stdout
