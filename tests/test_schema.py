"""The names the analysis reads are the names a record gives and the dashboard declares."""

import ast
import re
from pathlib import Path

import pytest
import yaml

from analysis.table import Derived
from harness.measure.figures import output_names, read_run_figures, run_inputs
from harness.schema import EngineRecord, Input, Output, RunFile

from run_records import write_run

ROOT = Path(__file__).resolve().parents[1]
MEASURING_COMPONENTS = ("experiment.yaml", "harness-job.yaml")
NAME = re.compile(r"[a-z][a-z0-9_]*")


def declared(component: str, kind: str = "outputs") -> set[str]:
    spec = yaml.safe_load((ROOT / "polyaxonfiles" / component).read_text())
    return {entry["name"] for entry in spec[kind]}


def declared_outputs(component: str) -> set[str]:
    return declared(component, "outputs")


@pytest.mark.parametrize("component", MEASURING_COMPONENTS)
def test_each_measuring_component_declares_exactly_the_figures_contract(component: str) -> None:
    """The components' output lists are the contract's names (`measure.figures.output_names`), no more and no
    fewer: a name misspelt in either place is a missing name and an extra one."""
    outputs = declared_outputs(component)
    assert len(outputs) >= 100 and "ttft_ms_p99" in outputs, f"{component}: no outputs list found"
    contract = output_names()
    assert (sorted(contract - outputs), sorted(outputs - contract)) == ([], [])


def test_every_output_the_analysis_reads_is_in_the_figures_contract() -> None:
    assert sorted(set(Output) - output_names()) == []


def test_every_input_the_analysis_reads_is_one_a_run_is_given(tmp_path: Path) -> None:
    """A real record's inputs (its engine's limits and its workload), the same workload at a capped rate against
    a service run, and the limits the experiment component takes: every `Input` is one of them."""
    figures = read_run_figures(write_run(tmp_path))
    at_rate = figures.config.model_copy(update={"service_uuid": "service", "load": figures.config.load.model_copy(
        update={"concurrency": None, "rate_per_s": 2.0, "max_concurrency": 2})})
    given = {*figures.inputs(), *run_inputs(at_rate, {}), *declared("experiment.yaml", "inputs")}
    assert {Input.MAX_NUM_SEQS, Input.CONCURRENCY, Input.RATE_PER_S} <= given
    assert sorted(set(Input) - given) == []


@pytest.mark.parametrize("component", MEASURING_COMPONENTS)
def test_every_output_the_analysis_reads_is_declared_by_each_measuring_component(component: str) -> None:
    """With `test_every_figure_a_run_record_gives_is_a_declared_output_of_its_type`, a figure renamed in the
    record but not here (or the other way round) fails a test instead of reading as None in a verdict."""
    assert sorted(set(Output) - declared_outputs(component)) == []


def quoted_names(path: Path) -> set[str]:
    """Every string constant of a module that could name a figure, whichever quotes it was written in."""
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value)}


def test_the_analysis_cites_declared_outputs_through_the_schema_only() -> None:
    """A quoted output or input name in the analysis would escape the checks above: the analysis names them
    through `Output` and `Input`, and the figures it derives through `analysis.table.Derived`, declared once."""
    modules = sorted((ROOT / "analysis").glob("*.py"))
    assert len(modules) >= 6 and "diagnose.py" in {path.name for path in modules}
    quoted = {path.name: quoted_names(path) for path in modules}
    assert set(Derived) <= quoted["table.py"]  # the scan reads the analysis's strings, where names are declared
    declared_names = set().union(*map(declared_outputs, MEASURING_COMPONENTS), set(Input), output_names())
    assert {name: sorted(names & declared_names) for name, names in quoted.items() if names & declared_names} == {}
    assert sorted(quoted["diagnose.py"] & set(Derived)) == []  # the rules cite derived figures by their names


def test_the_engine_record_reads_what_a_run_wrote(tmp_path: Path) -> None:
    written = EngineRecord(argv=["vllm", "serve", "m"], limits={"max_num_seqs": 4}, image_reference="img@sha256:ab")
    (tmp_path / RunFile.ENGINE).write_text(written.model_dump_json())
    assert EngineRecord.model_validate_json((tmp_path / "engine.json").read_text()) == written
