"""The polyaxonfiles' inputs that become `harness run` flags default to what the flag's field declares.

A job that leaves an input unset must measure what `harness run` would without the flag; an input with its own
default would make the cluster's runs differ from a local one without anyone choosing it.
"""

import re
from pathlib import Path

import pytest
import yaml

from harness.cli.fields import field_flags
from harness.cli.measure import run_command
from harness.measure.run_options import RunOptions, Slo
from harness.measure.schedule import LoadShape

ROOT = Path(__file__).resolve().parents[2]
# The one input that must differ: `harness run` has no default inventory (the user names one), while a job
# needs one the image holds, so the polyaxonfiles name the repository's own.
MUST_DIFFER = {"inventory"}
FLAG_OF_INPUT = re.compile(r"^(--[a-z0-9-]+)=\{\{ *(\w+) *\}\}$")


def inputs_as_flags(polyaxonfile: Path) -> dict[str, tuple[str, object]]:
    """{input name: (the `harness run` flag it renders as, its declared default or None)}."""
    spec = yaml.safe_load(polyaxonfile.read_text(encoding="utf-8"))
    args = spec["run"]["container"]["args"]
    args = args[:args.index("--")] if "--" in args else args  # after `--`: the engine's command line
    flags: dict[str, str] = {}
    for declared in spec["inputs"]:
        as_arg = any(f"params.{declared['name']}.as_arg" in arg for arg in args)  # rendered by its argFormat
        rendered = [declared["argFormat"]] if as_arg else []
        rendered += [arg for arg in args if f"{{{{ {declared['name']} }}}}" in arg]
        for text in rendered:
            found = FLAG_OF_INPUT.match(text)
            if found and found.group(2) == declared["name"]:
                flags[declared["name"]] = found.group(1)
    defaults = {declared["name"]: declared.get("value") for declared in spec["inputs"]}
    return {name: (flag, defaults[name]) for name, flag in flags.items()}


def field_default(flag: str) -> object:
    field = {flag: field for field, flag in field_flags(run_command).items()}[flag]
    (model,) = [model for model in (RunOptions, LoadShape, Slo) if field in model.model_fields]
    return model.model_fields[field].default


@pytest.mark.parametrize("name", ["experiment.yaml", "harness-job.yaml"])
def test_run_inputs_default_to_the_fields_defaults(name: str) -> None:
    inputs = inputs_as_flags(ROOT / "polyaxonfiles" / name)
    # found: the inventory, both loops, the output cap, the seed and both SLOs, and the scrape interval in the
    # experiment or the service measured by the job; the experiment's engine inputs are the engine's flags
    expected = {"inventory", "concurrency", "rate", "max_tokens", "seed", "slo_ttft_ms", "slo_tpot_ms"}
    assert set(inputs) == expected | ({"sample_interval_s"} if name == "experiment.yaml" else {"service_uuid"})
    differing = {input_name: (default, field_default(flag)) for input_name, (flag, default) in inputs.items()
                 if input_name not in MUST_DIFFER and default != field_default(flag)}
    assert differing == {}
