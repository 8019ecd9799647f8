"""A run's prefix-cache figures reach the dashboard as scalars, each an output the components declare."""

from __future__ import annotations

from pathlib import Path

import yaml

from harness.measure.figures import output_names
from harness.measure.record import Slo
from harness.measure.reuse_models import PrefixCacheFigures
from harness.measure.stats import summarize

ROOT = Path(__file__).resolve().parents[2]


def test_prefix_cache_figures_are_declared_scalar_outputs() -> None:
    figures = PrefixCacheFigures(block_size_tokens=128, cache_blocks=31, queried_tokens_measured=4000,
                                 hit_tokens_measured=1536, queried_tokens_predicted=4000, hit_tokens_predicted=1536,
                                 hit_tokens_reported=1536, eviction_possible=False, hits_as_predicted=True)
    summary = summarize([], [], slo=Slo(), offered_requests_per_s=None, offered_concurrency=1, cold=False,
                        max_dispatch_lag_ms=10.0).model_copy(update={"prefix_cache": figures})
    outputs = summary.outputs()
    assert "prefix_cache" not in outputs and "turns" not in outputs
    prefixed = {name: value for name, value in outputs.items() if name.startswith("prefix_cache_")}
    assert prefixed["prefix_cache_hit_tokens_predicted"] == prefixed["prefix_cache_hit_tokens_measured"] == 1536
    # every field once (no samples, so the counter's own prefix_cache_hits_during_run_tokens is None and left out)
    assert len(prefixed) == len(PrefixCacheFigures.model_fields)
    assert set(prefixed) <= output_names()  # the contract the components' outputs lists are held to
    for component in ("harness-job.yaml", "experiment.yaml"):
        spec = yaml.safe_load((ROOT / "polyaxonfiles" / component).read_text())
        declared = {output["name"] for output in spec["outputs"]}
        assert set(prefixed) <= declared
