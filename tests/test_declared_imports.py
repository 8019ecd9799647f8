"""Every third-party module the project imports is declared in pyproject.toml: the harness,
benchmarks and scripts in the runtime dependencies, the tests in those or the test extra."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
OWN = {"harness", "analysis", "conftest"} | {path.stem for folder in ("tests", "benchmarks")
                                             for path in (ROOT / folder).rglob("*.py")}
# Run by the engine's interpreter, whose virtual environment holds vllm, or on a GPU machine with its torch;
# the harness never imports either.
ENGINE_SIDE = {"benchmarks/vllm_drivers.py": {"vllm"}, "benchmarks/gpu_memory_terms.py": {"torch"}}


def third_party_imports(*folders: str) -> dict[str, str]:
    """Top-level module → the first file importing it (the engine-side drivers' vllm is the engine's own)."""
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    engine_own = ENGINE_SIDE.get(str(path.relative_to(ROOT)), set())
                    if top not in sys.stdlib_module_names and top not in OWN and top not in engine_own:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def undeclared(imports: dict[str, str], declared: set[NormalizedName]) -> list[str]:
    providers = packages_distributions()
    return [f"{module} ({where})" for module, where in sorted(imports.items())
            if not {canonicalize_name(dist) for dist in providers.get(module, [module])} & declared]


def test_every_import_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}
    test = runtime | {canonicalize_name(Requirement(line).name) for line in project["optional-dependencies"]["test"]}
    shipped, tested = third_party_imports("harness", "analysis", "benchmarks", "scripts"), third_party_imports("tests")
    assert {"pydantic", "yaml", "polyaxon"} <= shipped.keys() and "pytest" in tested  # the walk sees imports
    assert undeclared(shipped, runtime) == []
    assert undeclared(tested, test) == []
