"""The polyaxonfiles compile with Polyaxon's own compiler, and every bad input is refused before a start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.errors import HarnessError
from harness.launch.specs import check_files, parse_param_options, render

FILES = Path(__file__).resolve().parents[2] / "polyaxonfiles"
SERVICE = FILES / "vllm-service.yaml"
EXPERIMENT = FILES / "experiment.yaml"
HARNESS_JOB = FILES / "harness-job.yaml"
LOCAL_CPU = FILES / "presets" / "local-cpu.yaml"
GPU_A100 = FILES / "presets" / "gpu-a100-80gb.yaml"
IMAGE = "vllm/vllm-openai:v0.11.2@sha256:2c908d5a84ed251b6a17d179f42d06df1aff353007779ac5eecd8a0ea3fe9331"
REVISION = "1cfa9a7208912126459214e8b04321603b3df60c"


def test_production_service_renders_the_pinned_image_and_engine_arguments() -> None:
    rendered = render([SERVICE], parse_param_options(["max_model_len=4096", "max_num_seqs=8"]))
    assert rendered.kind == "service"
    assert rendered.image == IMAGE
    assert rendered.args[0].endswith('exec "$@" $HARNESS_ENGINE_EXTRA_ARGS')  # each input a word after it
    assert rendered.argv == [
        "python3", "-m", "vllm.entrypoints.openai.api_server",
        "--host=0.0.0.0", "--port=8000",
        "--model=Qwen/Qwen3-4B", f"--revision={REVISION}",
        "--max-model-len=4096",
        "--max-num-seqs=8",
        "--gpu-memory-utilization=0.9",
        "--kv-cache-dtype=auto",
        "--block-size=16",
        "--tensor-parallel-size=1",
        "--enable-prefix-caching",
        "--no-enforce-eager",
    ]  # fmt: skip
    assert rendered.ports == [8000]
    assert rendered.gpu_limit == 1
    assert rendered.node_selector == {}
    assert rendered.termination_timeout_s == 14400
    assert rendered.collect_logs is True


# What each committed file needs from the command line: the service nothing, anything that runs the
# harness a load (and the harness job a service); presets are checked on both components.
COMMAND_LINE_PARAMS: dict[str, dict[str, object]] = {
    "vllm-service.yaml": {},
    "harness-job.yaml": {"service_uuid": "0123456789abcdef0123456789abcdef", "concurrency": 8},
    "report.yaml": {"sweep_uuid": "0123456789abcdef0123456789abcdef", "limit": "max_num_seqs"},
}


def test_every_committed_polyaxonfile_compiles() -> None:
    files = sorted(FILES.rglob("*.yaml"))
    presets = [path for path in files if yaml.safe_load(path.read_text()).get("isPreset")]
    assert {path.name for path in presets} == {"local-cpu.yaml", "gpu-a100-80gb.yaml", "hf-weights-volume.yaml",
                                               "upload.yaml", "git-checkout.yaml"}
    for path in files:
        if yaml.safe_load(path.read_text()).get("hubRef"):
            continue  # its component comes from Polyaxon's public hub: tests/launch/test_cluster_path.py reads it
        if path in presets:
            check_files([SERVICE, path], {})
            check_files([EXPERIMENT, path], {"concurrency": 8})
        else:
            check_files([path], COMMAND_LINE_PARAMS.get(path.name, {"concurrency": 8}))


def test_optional_and_boolean_inputs_render_as_whole_arguments() -> None:
    rendered = render(
        [SERVICE],
        {"tensor_parallel_size": 2, "kv_cache_memory_bytes": 8 * 2**30, "enforce_eager": "true",
         "enable_prefix_caching": False, "max_num_batched_tokens": 8192, "extra_args": "--seed 7"},
    )  # fmt: skip
    argv = rendered.argv
    assert rendered.gpu_limit == 2 and "--tensor-parallel-size=2" in argv
    assert "--kv-cache-memory-bytes=8589934592" in argv
    assert "--max-num-batched-tokens=8192" in argv
    assert "--enforce-eager" in argv and "--no-enforce-eager" not in argv
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert argv[-2:] == ["--seed", "7"]
    assert "" not in argv


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_num_seqs": "eight"}, r"input max_num_seqs: 'eight' is not a whole number"),
        ({"max_model_len": 65536}, r"`max_model_len`.*less than or equal to `40960`"),
        ({"gpu_memory_utilization": 0}, r"`gpu_memory_utilization`.*greater than `0`"),
        ({"kv_cache_dtype": "fp16"}, r"`kv_cache_dtype`.*must be one of"),
        ({"max_num_seq": 8}, r"undeclared param `max_num_seq`"),
        ({"model": "Qwen/Qwen3-4B; rm -rf /"}, r"`model`.*must match the regex"),
    ],
    ids=["wrong-type", "out-of-range", "not-positive", "not-an-option", "unknown-input", "shell-in-model"],
)
def test_bad_service_params_are_refused_naming_file_and_input(params: dict, message: str) -> None:
    with pytest.raises(HarnessError, match=message) as refused:
        render([SERVICE], params)
    assert str(refused.value).startswith(f"{SERVICE}: ")


def test_a_missing_required_input_is_named() -> None:
    with pytest.raises(HarnessError, match=r"harness-job.yaml: missing required input\(s\) service_uuid; pass -P"):
        render([HARNESS_JOB], {})
    with pytest.raises(HarnessError, match=r"harness-job.yaml: Input service_uuid is required"):
        render([HARNESS_JOB], {"concurrency": 4})


def test_a_missing_polyaxonfile_is_named() -> None:
    with pytest.raises(HarnessError, match=r"no-such\.yaml: no such polyaxonfile"):
        render([FILES / "no-such.yaml"], {})


def test_presets_fill_what_params_leave_and_never_override_them() -> None:
    local = render([SERVICE, LOCAL_CPU], {"model": "/models/tiny", "max_num_seqs": 3}).inputs
    assert (local["max_num_seqs"], local["model"]) == (3, "/models/tiny")
    assert (local["max_model_len"], local["block_size"], local["enforce_eager"]) == (1024, 128, True)
    assert local["kv_cache_memory_bytes"] == 4 * 2**20
    gpu = render([SERVICE, GPU_A100], {"max_model_len": 4096})
    assert (gpu.inputs["max_model_len"], gpu.inputs["block_size"], gpu.gpu_limit) == (4096, 16, 1)
    assert gpu.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def test_the_experiment_starts_the_same_engine_command_as_the_service_on_loopback() -> None:
    params = {"max_model_len": 4096, "max_num_seqs": 8, "concurrency": 16}
    experiment = render([EXPERIMENT], params, run_globals={"run_outputs_path": "/plx/outputs"})
    assert experiment.args[0].startswith("command -v harness >/dev/null ||")  # installed where the image lacks it
    separator = experiment.argv.index("--")
    engine = experiment.argv[separator + 1 :]
    service = render([SERVICE], {"max_model_len": 4096, "max_num_seqs": 8}).argv
    assert engine == [word if word != "--host=0.0.0.0" else "--host=127.0.0.1" for word in service]
    harness = experiment.argv[:separator]
    assert harness[:2] == ["harness", "run"]
    assert "--concurrency=16" in harness and "--out=/plx/outputs/run" in harness
    assert not any(word.startswith("--rate") for word in harness)


def test_the_harness_job_passes_its_inputs_as_harness_run_flags() -> None:
    uuid = "0123456789abcdef0123456789abcdef"
    rendered = render(
        [HARNESS_JOB], {"service_uuid": uuid, "rate": 2.5, "max_tokens": 300, "seed": 3, "slo_ttft_ms": 500},
        run_globals={"run_outputs_path": "/plx/outputs"},
    )  # fmt: skip
    assert rendered.argv == [
        "harness", "run", f"--service-uuid={uuid}", "--inventory=prompts/qwen3-4b-fixed-4096x8",
        "--rate=2.5", "--max-tokens=300", "--seed=3", "--slo-ttft-ms=500.0",
        "--out=/plx/outputs/run",
    ]  # fmt: skip
    assert rendered.kind == "job" and rendered.image == IMAGE


@pytest.mark.parametrize("load", [{}, {"concurrency": 4, "rate": 1.0}], ids=["neither", "both"])
def test_exactly_one_of_concurrency_or_rate(load: dict) -> None:
    with pytest.raises(HarnessError, match=r"exactly one of 'concurrency'.* or 'rate'"):
        render([HARNESS_JOB], {"service_uuid": "0123456789abcdef0123456789abcdef", **load})


@pytest.mark.parametrize(
    ("sweep", "swept", "values"),
    [
        ("sweep-max-num-seqs.yaml", "max_num_seqs", [1, 2, 4, 8, 16, 32]),
        ("sweep-max-model-len.yaml", "max_model_len", [4096, 8192, 16384, 32768, 40960]),
    ],
)
def test_committed_sweeps_vary_one_limit_and_every_point_compiles(sweep: str, swept: str, values: list) -> None:
    points = check_files([FILES / sweep], {"concurrency": 8})
    assert [point[swept] for point in points] == values
    assert all(set(point) == {swept, "concurrency"} for point in points)
    # The same sweep on the embedded default: the points still win over the preset's limits.
    local_points = check_files([FILES / sweep, LOCAL_CPU], {"concurrency": 8, "model": "/models/tiny"})
    assert [point[swept] for point in local_points] == values


def _sweep(tmp_path: Path, matrix: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(f"kind: operation\npathRef: {EXPERIMENT}\nmatrix:\n{matrix}")
    return path


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        (
            "  kind: mapping\n  values:\n    - {max_num_seqs: 4}\n    - {max_num_seqs: 8}\n    - {max_num_seqs: 0}\n",
            r"point 2 \{'max_num_seqs': 0\}: .*`max_num_seqs`.*greater than or equal to `1`",
        ),
        (
            "  kind: mapping\n  values:\n    - {max_num_seqs: 4}\n    - {max_num_seqs: 8, max_model_len: 2048}\n",
            r"point 1 changes 'max_model_len' besides 'max_num_seqs'; a sweep varies exactly one limit",
        ),
        (
            "  kind: mapping\n  values:\n    - {max_num_seqs: many}\n",
            r"point 0 \{'max_num_seqs': 'many'\}: input max_num_seqs: 'many' is not a whole number",
        ),
        (
            "  kind: mapping\n  values:\n    - {max_num_seq: 4}\n",
            r"point 0 \{'max_num_seq': 4\}: .*undeclared param `max_num_seq`",
        ),
        (
            "  kind: grid\n  params:\n    max_model_len: {kind: choice, value: [1024, 99999]}\n",
            r"point 1 \{'max_model_len': 99999\}: .*less than or equal to `40960`",
        ),
        (
            "  kind: random\n  numRuns: 2\n  params:\n    max_num_seqs: {kind: choice, value: [1, 2]}\n",
            r"matrix kind 'random' cannot be checked point by point",
        ),
    ],
    ids=["out-of-range", "two-limits", "wrong-type", "unknown-input", "grid-out-of-range", "random"],
)
def test_bad_sweeps_are_refused_naming_file_point_and_input(tmp_path: Path, matrix: str, message: str) -> None:
    sweep = _sweep(tmp_path, matrix)
    with pytest.raises(HarnessError, match=message) as refused:
        check_files([sweep], {"concurrency": 4})
    assert str(sweep) in str(refused.value)


def test_check_command_prints_one_line_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, "  kind: mapping\n  values:\n    - {max_num_seqs: 4}\n    - {max_num_seqs: -1}\n")
    result = CliRunner().invoke(app, ["check", "-f", str(sweep), "-P", "concurrency=4"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert result.output.startswith(f"error: {sweep}: point 1 {{'max_num_seqs': -1}}: ")
    good = CliRunner().invoke(app, ["check", "-f", str(FILES / "sweep-max-num-seqs.yaml"), "-P", "concurrency=4"])
    assert good.exit_code == 0, good.output
    assert "6 sweep points each compiled" in good.output
    malformed = CliRunner().invoke(app, ["check", "-f", str(SERVICE), "-P", "max_num_seqs"])
    assert malformed.exit_code == 2 and "expected name=value" in malformed.output


def test_a_p_value_every_sweep_point_replaces_is_warned_about() -> None:
    sweep = str(FILES / "sweep-max-num-seqs.yaml")
    result = CliRunner().invoke(app, ["check", "-f", sweep, "-P", "concurrency=4", "-P", "max_num_seqs=4"])
    assert result.exit_code == 0, result.output
    assert "warning: -P max_num_seqs=4 is not used: every point of the sweep sets max_num_seqs" in result.output
    assert "-P concurrency=4 is not used" not in result.output
    quiet = CliRunner().invoke(app, ["check", "-f", sweep, "-P", "concurrency=4"])
    assert "warning" not in quiet.output


@pytest.mark.parametrize("value", ["1e3", "true", "8\n", " 8", "8.0", "0x10"])
def test_a_number_param_must_be_written_as_a_number_of_its_type(value: str) -> None:
    """Polyaxon alone reads `1e3` as 1000 and `true` as 1: the run would not be the one the user typed."""
    with pytest.raises(HarnessError, match=rf"input concurrency: {re.escape(repr(value))} is not a whole number"):
        render([EXPERIMENT], {"concurrency": value})


def test_numbers_written_as_numbers_pass() -> None:
    rendered = render([EXPERIMENT], {"rate": "1e-1", "max_tokens": "300", "gpu_memory_utilization": "0.5"})
    assert (rendered.inputs["rate"], rendered.inputs["max_tokens"]) == (0.1, 300)
    assert rendered.inputs["gpu_memory_utilization"] == 0.5
    with pytest.raises(HarnessError, match=r"input rate: '2,5' is not a decimal number"):
        render([EXPERIMENT], {"rate": "2,5"})
