"""Every command the README shows, run as written: against the real Polyaxon API (haupt sandbox, which stores
and compiles runs but never executes them) where it needs a cluster, with only the project and the output
directory swapped for the test's own. A README command no test here knows fails the first test.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from polyaxon.client import RunClient

from harness.track.tracking import track_run

from conftest import bash_commands, create_project
from run_records import write_run

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
README_PROJECT = "ACME/serving"  # the README's example project; the sandbox's owner is "default"
KINDS = ("make demo", "make test", "harness demo", "kubectl create secret", "export HARNESS_IMAGE=", "polyaxon run",
         "harness check", "harness sweep", "harness report", "TINY_MODEL=", "harness search")
BUILD_IMAGE = "polyaxonfiles/build-image.yaml"


def readme_commands() -> list[list[str]]:
    return bash_commands(ROOT / "README.md")


def commands_of(kind: str) -> list[list[str]]:
    return [words for words in readme_commands() if " ".join(words).startswith(kind)]


def in_project(words: list[str], project: str) -> list[str]:
    return [project if word == README_PROJECT else word for word in words]


def run(words: list[str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    """From the repository root, as a reader would; the programs from this environment."""
    program = str(BIN / words[0]) if (BIN / words[0]).exists() else words[0]
    return subprocess.run([program, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_every_readme_command_is_one_this_file_runs() -> None:
    commands = [" ".join(words) for words in readme_commands()]
    assert {kind for kind in KINDS if any(command.startswith(kind) for command in commands)} == set(KINDS)
    unknown = [command for command in commands if not command.startswith(KINDS)]
    assert unknown == [], f"README commands without a test: {unknown}"


def test_make_demo_and_make_test_are_targets() -> None:
    """The demo itself runs in test_demo.py and the suite is this; here: both targets exist as written."""
    makes = commands_of("make")
    assert sorted(words[1] for words in makes) == ["demo", "test"]
    for words in makes:
        dry = subprocess.run([*words[:1], "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert f"harness {words[1]}" in dry.stdout or "pytest" in dry.stdout


def test_harness_demo_repeats_as_written(tmp_path: Path) -> None:
    """The demo itself runs in test_demo.py (once per point: three engines per point is too long for the suite);
    here: `--repeats 3` makes a sweep that Polyaxon's compiler expands into each point three times."""
    from harness.dev.demo import PRESET, repeated_sweep
    from harness.launch.specs import check_files

    [words] = commands_of("harness demo")
    repeats = int(words[words.index("--repeats") + 1])
    points = check_files([repeated_sweep(tmp_path, repeats), PRESET], {"model": "tiny", "concurrency": 8})
    assert [point["max_num_seqs"] for point in points] == [1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8]


def test_the_secret_as_written_is_the_one_the_engines_read() -> None:
    """No cluster here to run kubectl on: the command must create the secret and key the components read,
    with a value made on the spot (never one written in the README)."""
    [words] = commands_of("kubectl create secret")
    assert words[:5] == ["kubectl", "create", "secret", "generic", "vllm-api-key"]
    [literal] = [word for word in words if word.startswith("--from-literal=")]
    name, value = literal.removeprefix("--from-literal=").split("=", 1)
    assert value.startswith("$(openssl rand ")
    for component in ("vllm-service.yaml", "experiment.yaml", "harness-job.yaml"):
        env = yaml.safe_load((ROOT / "polyaxonfiles" / component).read_text())["run"]["container"]["env"]
        [key] = [item["valueFrom"]["secretKeyRef"] for item in env if item["name"] == "VLLM_API_KEY"]
        assert (key["name"], key["key"]) == ("vllm-api-key", name), component


def test_harness_check_as_written() -> None:
    [words] = commands_of("harness check")
    checked = run(words)
    assert checked.returncode == 0, checked.stderr
    assert "valid, 6 sweep points each compiled" in checked.stdout


def harness_image_choices() -> list[list[str]]:
    """What `$HARNESS_IMAGE` stands for in the README: each `export HARNESS_IMAGE=...` it shows."""
    return [shlex.split(" ".join(words).split("=", 1)[1]) for words in commands_of("export HARNESS_IMAGE=")]


def submit(words: list[str], deadline_s: float = 60) -> subprocess.CompletedProcess:
    """The sandbox answers a new run with HTTP 405 while it is still expanding a matrix just submitted:
    submit again until it takes it."""
    deadline = time.monotonic() + deadline_s
    while True:
        created = run(words, timeout_s=120)
        if created.returncode == 0 or "Status: 405" not in created.stdout or time.monotonic() > deadline:
            return created
        time.sleep(2)


@pytest.mark.sandbox
def test_polyaxon_run_as_written(polyaxon_api: str) -> None:
    """Each `polyaxon run`, with `$HARNESS_IMAGE` as each of its README values, is accepted by the API. `-u`
    (uploading the tree) is left out: the sandbox has no artifacts store; the upload preset is kept."""
    create_project("readme-run")
    commands = [words for words in commands_of("polyaxon run") if BUILD_IMAGE not in words]
    assert len(commands) == 3 and len(harness_image_choices()) == 2
    sweep_uuid = "SWEEP_UUID"  # the report's placeholder: the sweep the commands before it created
    for words in commands:
        for image in harness_image_choices():
            expanded = [word for part in words for word in (image if part == "$HARNESS_IMAGE" else [part])]
            expanded = [word.replace("SWEEP_UUID", sweep_uuid) for word in expanded if word != "-u"]
            created = submit([*expanded, "-p", "readme-run"])
            assert created.returncode == 0, " ".join(expanded) + "\n" + created.stdout + created.stderr
            if "polyaxonfiles/sweep-max-num-seqs.yaml" in words:
                sweep_uuid = re.findall(r"\b[0-9a-f]{32}\b", created.stdout)[0]
    inputs = [run.inputs for run in RunClient(owner="default", project="readme-run").list(limit=100).results]
    # runs not compiled yet hold their -P values as given (strings)
    assert any(str(i.get("max_num_seqs")) == "8" and str(i.get("concurrency")) == "32" for i in inputs), inputs
    assert any("sweep_uuid" in i for i in inputs)


def test_the_image_build_as_written_names_the_dockerfile_and_the_registry() -> None:
    """`polyaxon run -u -f polyaxonfiles/build-image.yaml` needs Polyaxon's public hub for its `kaniko`
    component, which this machine cannot reach: what can be checked offline is that the operation asks
    for kaniko, builds the root Dockerfile from the uploads and pushes through the registry connection."""
    [words] = [words for words in commands_of("polyaxon run") if BUILD_IMAGE in words]
    assert "-u" in words
    operation = yaml.safe_load((ROOT / BUILD_IMAGE).read_text(encoding="utf-8"))
    assert operation["hubRef"] == "kaniko"
    assert operation["params"]["destination"]["connection"] == "docker-registry"
    assert (ROOT / operation["params"]["dockerfile"]["value"]).is_file()
    assert operation["params"]["context"]["value"].endswith("/uploads")


@pytest.mark.sandbox
def test_harness_sweep_as_written_reaches_the_services(polyaxon_api: str, tmp_path: Path) -> None:
    """The sandbox never runs a service, so each point ends 'service_late' after its deadline; what matters
    is that the command's -P values pass every check and each point's service is created."""
    create_project("readme-sweep")
    [words] = commands_of("harness sweep")
    swept = run([*in_project(words, "default/readme-sweep"), "--running-deadline-s", "0.5",
                 "--out", str(tmp_path / "sweep")])
    assert swept.returncode == 3, swept.stderr  # finished, but no point was measured
    result = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [point["params"]["max_num_seqs"] for point in result["points"]] == [1, 2, 4, 8, 16, 32]
    assert {point["outcome"] for point in result["points"]} == {"service_late"}
    services = RunClient(owner="default", project="readme-sweep").list(limit=100).results
    assert sorted(service.inputs["max_num_seqs"] for service in services) == [1, 2, 4, 8, 16, 32]


@pytest.mark.sandbox
def test_harness_report_as_written(polyaxon_api: str, tmp_path: Path) -> None:
    create_project("readme-report")
    tracked = [track_run(write_run(tmp_path / "runs", limits={"max_num_seqs": seqs}), project="default/readme-report")
               for seqs in (2, 4)]
    [words] = commands_of("harness report")
    out = tmp_path / "report"
    written = run([*in_project(words[:-2], "default/readme-report"), "--out", str(out)])
    assert words[-2] == "--out"  # only the output directory is the test's own
    assert written.returncode == 0, written.stderr
    assert {line.split(":")[0] for line in written.stdout.splitlines()[:-1]} == {run.run_uuid for run in tracked}
    assert (out / "report.md").exists() and (out / "report.html").exists()


def test_the_tiny_model_as_written_is_the_directory_harness_model_tiny_prints(tiny_model_dir: Path) -> None:
    [words] = commands_of("TINY_MODEL=")
    assert words == ["TINY_MODEL=$(harness", "model", "tiny)"]  # the shell's command substitution, as typed
    printed = run(["harness", "model", "tiny"], timeout_s=120)
    assert printed.returncode == 0 and Path(printed.stdout.strip()) == tiny_model_dir
    assert (tiny_model_dir / "model.safetensors").is_file()


@pytest.mark.engine
def test_harness_search_as_written_answers_and_predicts_the_kv_knee(tiny_model_dir: Path, tmp_path: Path) -> None:
    """On the demo's engine (31 usable blocks of 128, requests of 5 to 8 blocks): arrivals wait from 6. Which
    limit the README's fixed 400 ms meets first depends on the CPU (on a slow one, the prefills of two requests
    in flight already pass it); the KV knee itself is measured against a limit in the machine's own unit in
    tests/search/test_search_engine.py."""
    [words] = commands_of("harness search")
    out = tmp_path / "search"
    words = [f"model={tiny_model_dir}" if word == "model=$TINY_MODEL" else str(out) if word == "runs/search"
             else word for word in words]
    searched = run(words, timeout_s=1200)
    assert searched.returncode == 0, searched.stdout + searched.stderr[-3000:]
    lines = searched.stdout.splitlines()
    assert lines[0].startswith("max concurrency meeting p99 TTFT ≤ 400 ms: ")
    assert lines[1].startswith("the knee: ")
    assert "predicted knee concurrency 6 (kv_cache)" in searched.stdout
    assert (out / "search.md").exists() and (out / "capacity-curve-0.png").exists()
    assert any((out / "polyaxon" / "runs").iterdir())  # --local: the probes and the search tracked offline


@pytest.mark.parametrize("words", [words for words in readme_commands() if words[0] == "harness"],
                         ids=lambda words: " ".join(words[:2]))
def test_readme_harness_commands_take_the_options_they_show(words: list[str]) -> None:
    """`--help` of each command lists every option the README passes it (a renamed option breaks here)."""
    helped = run([*words[:2], "--help"], timeout_s=60)
    shown = {word.split("=")[0] for word in words if word.startswith("-")}
    assert helped.returncode == 0
    assert [option for option in shown if option not in helped.stdout] == []
