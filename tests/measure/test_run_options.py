"""`harness run`'s options are declared once, on the models' fields: the CLI reads each default and help from
its field, and a refusal names the field in the library and the flag on the command line."""

import inspect

import pytest
import typer.main
from pydantic import BaseModel, ValidationError
from typer.models import OptionInfo
from typer.testing import CliRunner

from harness.cli import app
from harness.cli.fields import FieldOption, field_flags
from harness.cli.measure import run_command
from harness.measure.run_options import RunOptions, Slo
from harness.measure.schedule import LoadShape

NOT_FIELDS = {"out", "force", "project", "offline_root"}  # where the record goes and where it is tracked
MODELS: tuple[type[BaseModel], ...] = (RunOptions, LoadShape, Slo)


def field_options() -> dict[str, FieldOption]:
    return {name: parameter.default for name, parameter in inspect.signature(run_command).parameters.items()
            if isinstance(parameter.default, FieldOption)}


def declaring_model(field: str) -> type[BaseModel]:
    (model,) = [model for model in MODELS if field in model.model_fields]  # a field name is one model's only
    return model


def test_every_run_option_reads_its_default_and_help_from_its_field() -> None:
    options = field_options()
    others = {name for name, parameter in inspect.signature(run_command).parameters.items()
              if isinstance(parameter.default, OptionInfo) and name not in options}
    assert len(options) == 26  # 10 load options (--think-time-s too), 3 SLO options and 13 more: a new one shows
    assert others == NOT_FIELDS
    for name, option in options.items():
        declared = declaring_model(option.field).model_fields[option.field]
        assert option.help == declared.description and option.help, name
        assert option.default == (... if declared.is_required() else declared.default), name


def test_each_field_maps_to_the_flag_harness_run_takes() -> None:
    flags = field_flags(run_command)
    assert (flags["rate_per_s"], flags["warmup_requests"], flags["ttft_ms"], flags["max_tokens"]) == (
        "--rate", "--warmup", "--slo-ttft-ms", "--max-tokens")
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    taken = {opt for parameter in command.params for opt in parameter.opts}
    assert len(flags) == 26 and set(flags.values()) <= taken


def test_the_command_typer_builds_carries_the_fields_defaults_and_descriptions() -> None:
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    by_flag = {max(parameter.opts, key=len): parameter for parameter in command.params}
    rate, interval = by_flag["--rate"], by_flag["--sample-interval-s"]
    assert (rate.help, rate.default) == ("open loop: mean arrivals per second", None)
    assert (interval.help, interval.default) == (RunOptions.model_fields["sample_interval_s"].description, 5.0)


def test_a_rule_across_load_fields_names_the_fields_in_the_library() -> None:
    with pytest.raises(ValidationError) as refused:
        LoadShape(concurrency=1, rate_per_s=2.0)
    assert "set exactly one of concurrency (closed loop) or rate_per_s (open loop)" in str(refused.value)
    assert "--rate" not in str(refused.value)


def test_a_rule_across_load_fields_names_the_flags_on_the_command_line() -> None:
    result = CliRunner().invoke(app, ["run", "--inventory", "x", "--out", "y", "--base-url", "http://h",
                                      "--concurrency", "1", "--rate", "2"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == "error: set exactly one of --concurrency (closed loop) or --rate (open loop)"


def test_a_run_without_a_server_names_the_fields_or_the_flags() -> None:
    with pytest.raises(ValidationError, match=r"give base_url, service_uuid, or both"):
        RunOptions(inventory="x", load=LoadShape(concurrency=1))
    result = CliRunner().invoke(app, ["run", "--inventory", "x", "--out", "y", "--concurrency", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == ("error: give --base-url, --service-uuid, or both (the service's run, reached at "
                                     "the URL)")


@pytest.mark.parametrize(("options", "message"), [
    (["--max-tokens", "0"], "error: --max-tokens: Input should be greater than or equal to 1, not 0"),
    (["--warmup", "-1"], "error: --warmup: Input should be greater than or equal to 0, not -1"),
    (["--slo-ttft-ms", "0"], "error: --slo-ttft-ms: Input should be greater than 0, not 0.0"),
    (["--sample-interval-s", "0"], "error: --sample-interval-s: Input should be greater than 0, not 0.0"),
])
def test_a_refused_value_names_the_flag_and_the_value(options: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["run", "--inventory", "x", "--out", "y", "--base-url", "http://h",
                                      "--concurrency", "1", *options])
    assert result.exit_code == 2
    assert result.output.strip() == message


def test_run_options_are_built_from_python_with_keywords_and_the_fields_defaults() -> None:
    options = RunOptions(inventory="x", base_url="http://h", load=LoadShape(concurrency=2), max_tokens=8)
    assert (options.max_tokens, options.sample_interval_s, options.ready_timeout_s) == (8, 5.0, 600.0)
    with pytest.raises(ValidationError) as refused:
        RunOptions(inventory="x", base_url="http://h", load=LoadShape(concurrency=2), max_tokens=0)
    assert refused.value.errors()[0]["loc"] == ("max_tokens",)
