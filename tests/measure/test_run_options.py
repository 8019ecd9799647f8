"""`harness run`'s options are one model: the CLI maps onto it with the same defaults, and refuses by option name."""

import inspect

import pytest
from typer.models import OptionInfo
from typer.testing import CliRunner

from harness.cli import app
from harness.cli.measure import run_command
from harness.errors import HarnessError
from harness.measure.run_options import LOAD_OPTION_NAMES, RunOptions, command_line_options
from harness.measure.schedule import LoadShape

NOT_RUN_OPTIONS = {"out", "force", "ready_timeout_s", "project", "offline_root", "engine"}  # where, not what
SPLIT_OPTIONS = {"slo_ttft_ms": ("slo", "ttft_ms"), "slo_tpot_ms": ("slo", "tpot_ms"),
                 "slo_target_share": ("slo", "target_share")}


def cli_defaults() -> dict[str, object]:
    return {name: parameter.default.default for name, parameter in inspect.signature(run_command).parameters.items()
            if isinstance(parameter.default, OptionInfo) and name not in NOT_RUN_OPTIONS}


def model_default(option: str) -> object:
    """The model's default for a CLI option: a load option is `LoadShape`'s, an SLO option the `Slo`'s."""
    load_field = {cli: field for field, cli in LOAD_OPTION_NAMES.items()}.get(option, option)
    if load_field in LoadShape.model_fields:
        return LoadShape.model_fields[load_field].default
    if option in SPLIT_OPTIONS:
        outer, inner = SPLIT_OPTIONS[option]
        return getattr(RunOptions.model_fields[outer].default, inner)
    return RunOptions.model_fields[option].default


def test_every_run_option_has_the_models_default() -> None:
    defaults = cli_defaults()
    assert len(defaults) == 24  # 9 load options, 3 SLO options and 12 more: a new option shows up here
    mismatched = {option: (value, model_default(option)) for option, value in defaults.items()
                  if option != "inventory" and value != model_default(option)}
    assert mismatched == {}


def test_a_refused_value_names_the_option_and_the_value() -> None:
    with pytest.raises(HarnessError) as refused:
        command_line_options(inventory="x", base_url="http://h", load={"concurrency": 1}, max_tokens=0)
    assert str(refused.value) == "--max-tokens: Input should be greater than or equal to 1, not 0"


def test_a_rule_across_load_options_is_stated_whole() -> None:
    with pytest.raises(HarnessError, match=r"set exactly one of concurrency \(closed loop\) or rate_per_s"):
        command_line_options(inventory="x", base_url="http://h", load={"concurrency": 1, "rate_per_s": 2.0})


def test_a_sample_interval_of_zero_is_refused_on_the_command_line() -> None:
    result = CliRunner().invoke(app, ["run", "--inventory", "x", "--out", "y", "--base-url", "http://h",
                                      "--concurrency", "1", "--sample-interval-s", "0"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --sample-interval-s: Input should be greater than 0, not 0.0"
