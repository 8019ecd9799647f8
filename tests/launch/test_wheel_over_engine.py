"""The harness image without Docker: the built wheel in its own venv over the engine's packages, then the
experiment's compiled command run from outside the repository against the real CPU engine.

The Dockerfile installs the harness into a `--system-site-packages --without-pip` venv over the pinned
image's Python. Here the engine's venv stands in for that Python. `--system-site-packages` would expose
the site-packages of the interpreter the engine's venv was made from, not the engine's own, so the
harness venv sees the engine's packages through a .pth file instead (the engine's site-packages play the
image's system site, behind the venv's own); the engine's `python3` comes first on PATH, and `harness`
is the venv's script, as the image links it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.launch.engine_process import engine_python
from harness.launch.specs import render

import child_programs
from conftest import ran_but_for_a_busy_machine

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]
IN_CONTAINER_PORT = 8000  # experiment.yaml's engine listens here, inside its own pod


def site_packages(python: Path) -> Path:
    return Path(subprocess.run(child_programs.argv("print-purelib", python=python),
                               capture_output=True, text=True, check=True, timeout=120).stdout.strip())


def freeze(python: Path) -> list[str]:
    return subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                          check=True, timeout=300).stdout.splitlines()


def pip_check(python: Path) -> set[str]:
    """The requirement problems pip finds in an environment, one per line; empty when there are none."""
    checked = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    return set() if checked.returncode == 0 else set(checked.stdout.splitlines())


def build_wheel(out: Path) -> Path:
    """From a copy of the source tree, so the build leaves nothing behind in the repository."""
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "reports", "build", "dist",
                                                                 "*.egg-info", "__pycache__", "tests"))
    subprocess.run([*PIP, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out / "wheel"), str(source)],
                   check=True, capture_output=True, timeout=600)
    [wheel] = (out / "wheel").glob("vllm_serving_harness-*.whl")
    return wheel


@pytest.mark.engine
def test_the_wheel_installs_beside_the_engine_without_changing_it_and_runs_the_experiment(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as probe:  # the compiled command's engine port; another engine here would answer
        assert probe.connect_ex(("127.0.0.1", IN_CONTAINER_PORT)) != 0, "port 8000 is taken on this machine"
    engine = engine_python()
    engine_before = freeze(engine)
    wheel = build_wheel(tmp_path)

    venv = tmp_path / "harness-venv"
    subprocess.run([str(engine), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    harness_python = venv / "bin" / "python"
    purelib = site_packages(harness_python)
    (purelib / "engine-image-site.pth").write_text(f"{site_packages(engine)}\n")
    installed = subprocess.run([str(harness_python), "-m", "pip", "install", "--quiet", str(wheel)],
                               capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]

    assert freeze(engine) == engine_before  # not one of the engine's packages changed
    # scripts/install-engine.sh removes torchvision/torchaudio on purpose (they break the CPU torch), so the
    # engine's own `pip check` already names them: the harness venv must add no problem of its own
    checked = pip_check(harness_python)
    assert checked <= pip_check(engine), checked - pip_check(engine)

    image_path = tmp_path / "image-bin"  # what the image's PATH offers: its python3, and the linked harness
    image_path.mkdir()
    (image_path / "python3").write_text(f'#!/bin/sh\nexec "{engine}" "$@"\n')
    (image_path / "python3").chmod(0o755)
    (image_path / "harness").symlink_to(venv / "bin" / "harness")
    outputs = tmp_path / "outputs"
    experiment = render(
        [ROOT / "polyaxonfiles" / "experiment.yaml", ROOT / "polyaxonfiles" / "presets" / "local-cpu.yaml"],
        {"model": str(tiny_model_dir), "inventory": "prompts/tiny-qwen3-600x8", "concurrency": 8},
        run_globals={"run_outputs_path": str(outputs)},
    )
    elsewhere = tmp_path / "workdir"  # neither the repository nor a tree holding prompts/
    elsewhere.mkdir()
    offline = tmp_path / "polyaxon"  # tracked offline, as a managed run would be tracked by its API
    env = {"PATH": f"{image_path}:/usr/bin:/bin", "HOME": os.environ["HOME"], **experiment.env,
           "VLLM_API_KEY": os.environ["VLLM_API_KEY"],  # the engine refuses to serve without one
           "HARNESS_CONTAINER_IMAGE": "", "HARNESS_OFFLINE_ROOT": str(offline), "HARNESS_PROJECT": "local/wheel"}
    done = subprocess.run([*experiment.command, *experiment.args], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=900)
    run_dir = outputs / "run"
    assert ran_but_for_a_busy_machine(done.returncode, run_dir), done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["requests_ok"] == 8  # the inventory's 8 prompts, every one answered
    bundled = json.loads((ROOT / "prompts" / "tiny-qwen3-600x8" / "manifest.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["inventory_path"] == "prompts/tiny-qwen3-600x8"
    assert config["inventory_digest"] == bundled["inventory_sha256"]  # the inventory that travelled in the wheel
    engine_record = json.loads((run_dir / "engine.json").read_text())
    assert engine_record["argv"][0] == "python3" and engine_record["limits"]["max_num_seqs"] == 8
    assert not (elsewhere / "prompts").exists()  # resolved from the package, not copied next to the command

    device = json.loads((run_dir / "device.json").read_text())
    assert device["engine_dtype"] == "bfloat16"  # the tiny model's config.json asks for bfloat16
    assert device["gpu_name"] is None and device["cpu_model"]
    assert device["peak_engine_rss_bytes"] > 200 * 2**20  # importing torch alone takes more than 200 MiB
    uuid = json.loads((run_dir / "tracking.json").read_text())["run_uuid"]
    tracked = json.loads((offline / "runs" / uuid / "run.plx.json").read_text())
    assert tracked["status"] == "succeeded" and tracked["inputs"]["engine_dtype"] == "bfloat16"
    assert tracked["outputs"]["peak_engine_rss_bytes"] == device["peak_engine_rss_bytes"]
    series = offline / "runs" / uuid / "events" / "metric"
    assert (series / "live_running_requests.plx").exists() and (series / "live_engine_rss_bytes.plx").exists()
