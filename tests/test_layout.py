"""The tree tells the flow: stage packages that import only earlier stages, modules one person can hold in mind,
and a README layout that names what is there."""

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "harness"
MAX_MODULE_LINES = 400


def stage_of(module: str) -> str:
    """'harness.measure.runner' → 'measure'; a top-level module ('harness.errors') is the base, 'cli' the top."""
    parts = module.split(".")
    if len(parts) > 2:
        return parts[1]
    return "cli" if parts[1:] == ["cli"] else "base"


def stage_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        source = stage_of(module) if module != "harness" else "base"
        graph.setdefault(source, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness."):
                target = stage_of(node.module)
                if target != source:
                    graph[source].add(target)
    return graph


def test_no_module_is_longer_than_one_person_holds_in_mind() -> None:
    modules = list(PACKAGE.rglob("*.py"))
    assert len(modules) >= 60 and PACKAGE / "explain" / "diagnose.py" in modules
    long = {str(path.relative_to(ROOT)): lines for path in modules
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_stages_import_no_later_stage() -> None:
    graph = stage_imports()
    assert {"base", "measure", "observe", "explain", "cli"} <= graph.keys() and "measure" in graph["cli"]
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as cycle:
        raise AssertionError(f"package cycle: {cycle.args[1]}") from None
    assert order[0] == "base" and order[-1] == "cli"
    assert graph["base"] == set()  # errors, schema, the Polyaxon call: every stage may use them, they use none


def test_the_readme_layout_names_every_stage_package_and_nothing_else() -> None:
    layout = re.search(r"## Layout\n```\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    listed = set(re.findall(r"^  (\w+)/", layout, re.M))  # the stage folders, indented under harness/
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert len(packages) >= 8 and {"measure", "explain"} <= packages
    assert listed == packages
