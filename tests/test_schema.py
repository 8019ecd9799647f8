"""The names the analysis reads are the names a record gives and the dashboard declares."""

import re
from pathlib import Path

import pytest
import yaml

from harness.schema import EngineRecord, Output, RunFile

ROOT = Path(__file__).resolve().parents[1]
MEASURING_COMPONENTS = ("experiment.yaml", "harness-job.yaml")


def declared_outputs(component: str) -> set[str]:
    spec = yaml.safe_load((ROOT / "polyaxonfiles" / component).read_text())
    return {output["name"] for output in spec["outputs"]}


@pytest.mark.parametrize("component", MEASURING_COMPONENTS)
def test_every_output_the_analysis_reads_is_declared_by_each_measuring_component(component: str) -> None:
    """With `test_every_figure_a_run_record_gives_is_a_declared_output_of_its_type`, a figure renamed in the
    record but not here (or the other way round) fails a test instead of reading as None in a verdict."""
    assert sorted(set(Output) - declared_outputs(component)) == []


def test_the_analysis_cites_declared_outputs_through_the_schema_only() -> None:
    """A quoted output name in the analysis would escape the check above."""
    declared = declared_outputs("experiment.yaml")
    quoted = {(path.name, name) for path in (ROOT / "analysis").glob("*.py")
              for name in re.findall(r'"([a-z][a-z0-9_]*)"', path.read_text()) if name in declared}
    assert quoted == set()


def test_the_engine_record_reads_what_a_run_wrote(tmp_path: Path) -> None:
    written = EngineRecord(argv=["vllm", "serve", "m"], limits={"max_num_seqs": 4}, image_reference="img@sha256:ab")
    (tmp_path / RunFile.ENGINE).write_text(written.model_dump_json())
    assert EngineRecord.model_validate_json((tmp_path / "engine.json").read_text()) == written
