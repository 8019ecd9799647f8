"""The sampler's warm-up after the cache: `harness budget --gpu` and the field check answer when it has no room."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.calibrate.field_check import run_field_check

HARNESS = str(Path(sys.executable).parent / "harness")
CORPUS = Path(__file__).parents[1] / "fixtures" / "field"
GPT_OSS_20B = CORPUS / "configs" / "openai--gpt-oss-20b.json"
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "400"}


@pytest.mark.parametrize(
    ("utilization", "words"),
    [
        # Left after the cache: total × (1 − utilisation) + the activation peak − the graphs (captured out of
        # what the cache left before 0.21). 0.11.0 sorts (no FlashInfer stated): the warm-up over 1,024 rows ×
        # 201,088 logits × 36.71 B + 1,024 × 2,880 hidden × 2 B = 7.05 GiB; the profile's peak is the same sort
        # beside 8,192 tokens' hidden states, 7.08 GiB. At 0.9 of 79.22 GiB: 7.92 + 7.08 − 0.54 = 14.46 GiB left.
        ("0.9", "fits: "),
        # At 0.99: 0.79 + 7.08 − 0.54 = 7.34 GiB left (unrounded, 0.792 + 7.084 − 0.540), more than 7.05, but not
        # with twice the graph estimate (6.80).
        ("0.99", "at risk: the sampler's warm-up after the cache (1,024 rows × 201,088 logits, sort) needs 7.05 "
                 "GiB; 7.34 GiB are left"),
        # At 1.0: 7.08 − 0.54 = 6.54 GiB left, less than the 7.05 the warm-up needs.
        ("1.0", "does not fit: the sampler's warm-up after the cache (1,024 rows × 201,088 logits, sort) needs "
                "7.05 GiB; 6.54 GiB are left"),
    ],
)
def test_budget_answers_a_warm_up_without_room_with_its_figures(utilization: str, words: str) -> None:
    """gpt-oss-20b (mxfp4) on an H100 with 0.11.0's defaults: the cache holds 8,192-token requests at every
    utilisation here; whether the start survives the warm-up after it is what changes."""
    result = subprocess.run([HARNESS, "budget", "--model", str(GPT_OSS_20B), "--gpu", "H100-80GB", "--engine-version",
                             "0.11.0", "--quantization", "mxfp4", "--max-model-len", "8192",
                             "--gpu-memory-utilization", utilization], capture_output=True, text=True, env=OFFLINE,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert words in " ".join(result.stdout.split())


def test_no_start_of_the_field_corpus_is_refused_for_its_warm_up() -> None:
    """Every V1 start the corpus logs served (or sized its cache), so the warm-up check, with each log's own
    CUDA-graph figure where it prints one, must leave room for each; V0 starts have no warm-up after the cache."""
    report = run_field_check(CORPUS)
    checked = [case for case in report.cases if case.launch.warmup is not None]
    assert len(checked) >= 12  # the scan found the V1 starts it judges
    refused = [case.id for case in checked if case.cache_fit and case.launch.warmup is not None
               and case.launch.warmup.verdict == "does not fit"]
    assert refused == []
    logged = [case for case in checked if case.launch.warmup is not None
              and case.launch.warmup.cuda_graph_source == "as logged"]
    assert logged, "no case was judged with its own logged graph memory"
