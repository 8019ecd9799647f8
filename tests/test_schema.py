"""The names the analysis reads are the names a record gives and the dashboard declares."""

import ast
import re
from pathlib import Path

import pytest
import yaml

from harness.schema import EngineRecord, Output, RunFile

ROOT = Path(__file__).resolve().parents[1]
MEASURING_COMPONENTS = ("experiment.yaml", "harness-job.yaml")
NAME = re.compile(r"[a-z][a-z0-9_]*")


def declared_outputs(component: str) -> set[str]:
    spec = yaml.safe_load((ROOT / "polyaxonfiles" / component).read_text())
    return {output["name"] for output in spec["outputs"]}


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
    """A quoted output name in the analysis would escape the check above. Inputs (`max_num_seqs`, `block_size`)
    and the figures the analysis derives (`kv_tokens_needed_padded`) are no component's outputs, so they stay."""
    modules = sorted((ROOT / "analysis").glob("*.py"))
    assert len(modules) >= 6 and "diagnose.py" in {path.name for path in modules}
    quoted = {path.name: quoted_names(path) for path in modules}
    assert "max_num_seqs" in quoted["diagnose.py"]  # the scan reads the analysis's strings
    declared = set().union(*map(declared_outputs, MEASURING_COMPONENTS))
    assert {name: sorted(names & declared) for name, names in quoted.items() if names & declared} == {}


def test_the_engine_record_reads_what_a_run_wrote(tmp_path: Path) -> None:
    written = EngineRecord(argv=["vllm", "serve", "m"], limits={"max_num_seqs": 4}, image_reference="img@sha256:ab")
    (tmp_path / RunFile.ENGINE).write_text(written.model_dump_json())
    assert EngineRecord.model_validate_json((tmp_path / "engine.json").read_text()) == written
