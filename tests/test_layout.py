"""The tree tells the flow: stage packages that import only earlier stages, modules one person can hold in mind,
and a README layout that names what is there."""

import ast
import re
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "harness"
ANALYSIS = ROOT / "analysis"  # the card's top-level stage: join, comparison, diagnosis, report
MAX_MODULE_LINES = 400
# The pipeline, first to last: each stage may import only the stages before it.
STAGE_ORDER = ("base", "predict", "observe", "calibrate", "inventory", "measure", "track", "launch", "analysis",
               "search", "dev", "cli")


def stage_of(module: str) -> str:
    """'harness.measure.runner' → 'measure', 'analysis.report' → 'analysis'; a top-level module
    ('harness.errors') is the base, 'cli' the top."""
    parts = module.split(".")
    if parts[0] == "analysis":
        return "analysis"
    if len(parts) > 2:
        return parts[1]
    return "cli" if parts[1:] == ["cli"] else "base"


def modules() -> list[Path]:
    return [*PACKAGE.rglob("*.py"), *ANALYSIS.rglob("*.py")]


def stage_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in modules():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        source = stage_of(module) if module != "harness" else "base"
        graph.setdefault(source, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in {"harness",
                                                                                                 "analysis"}:
                target = stage_of(node.module)
                if target != source:
                    graph[source].add(target)
    return graph


def test_no_module_is_longer_than_one_person_holds_in_mind() -> None:
    found = modules()
    assert len(found) >= 60 and ANALYSIS / "diagnose.py" in found
    long = {str(path.relative_to(ROOT)): lines for path in found
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_stages_import_no_later_stage() -> None:
    graph = stage_imports()
    assert set(graph) == set(STAGE_ORDER) and "measure" in graph["cli"] and "analysis" in graph["cli"]
    try:
        TopologicalSorter(graph).static_order()
    except CycleError as cycle:
        raise AssertionError(f"package cycle: {cycle.args[1]}") from None
    later = {stage: sorted(target for target in targets if STAGE_ORDER.index(target) > STAGE_ORDER.index(stage))
             for stage, targets in graph.items()}
    assert {stage: targets for stage, targets in later.items() if targets} == {}
    assert graph["base"] == set()  # errors, schema, the Polyaxon call: every stage may use them, they use none


def test_the_readme_layout_names_every_stage_package_and_nothing_else() -> None:
    found = re.search(r"## Layout\n```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert found, "the README has no Layout block"
    layout = found.group(1)
    listed = set(re.findall(r"^  (\w+)/", layout, re.M))  # the stage folders, indented under harness/
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert len(packages) >= 8 and {"measure", "inventory", "search"} <= packages
    assert listed == packages
    assert re.search(r"^analysis/ ", layout, re.M), "the README layout names the top-level analysis/ stage"


def test_the_analysis_reads_only_the_base_and_the_record() -> None:
    """The analysis joins what runs left; it needs what a record is, not how it was measured or tracked."""
    assert graph_of_analysis() - {"base", "measure.record", "measure.figures"} == set()


def graph_of_analysis() -> set[str]:
    imported: set[str] = set()
    for path in ANALYSIS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness."):
                parts = node.module.split(".")
                imported.add("base" if len(parts) == 2 else ".".join(parts[1:3]))
    assert imported, "the scan found no import of the harness in analysis/"
    return imported


def test_every_package_ships_in_the_wheel() -> None:
    """An installed harness (the image, a venv) holds only the packages pyproject.toml lists."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(path.parent.relative_to(ROOT).parts) for path in [*PACKAGE.rglob("__init__.py"),
                                                                        *ANALYSIS.rglob("__init__.py")]}
    assert len(found) >= 12 and {"harness.search", "analysis"} <= found
    assert found - listed == set()
