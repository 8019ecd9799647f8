"""Every wait on another process in the tests is bounded: a hung child fails its test instead of the run."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
RUNNERS = {"run", "call", "check_call", "check_output"}  # subprocess.<name>(...)


def unbounded_waits(source: str) -> list[int]:
    """Lines of subprocess.run/call/check_call/check_output, .communicate() and .wait() calls without a timeout."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        is_runner = name in RUNNERS and isinstance(owner, ast.Name) and owner.id == "subprocess"
        positional_limit = {"communicate": 2, "wait": 1}.get(name)  # Popen.communicate(input, timeout), .wait(timeout)
        if not is_runner and positional_limit is None:
            continue
        if any(keyword.arg == "timeout" for keyword in node.keywords):
            continue
        if positional_limit is not None and len(node.args) >= positional_limit:
            continue
        lines.append(node.lineno)
    return lines


def test_every_subprocess_read_in_the_tests_has_a_timeout() -> None:
    tests = sorted(TESTS.rglob("*.py"))
    assert len(tests) >= 40 and TESTS / "launch" / "test_cluster_path.py" in tests
    found = {str(path.relative_to(TESTS)): lines for path in tests
             if (lines := unbounded_waits(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_the_check_sees_each_kind_of_unbounded_wait() -> None:
    source = ("subprocess.run(['x'])\nsubprocess.check_output(['x'], timeout=1)\np.communicate()\n"
              "p.communicate(timeout=5)\np.wait()\np.wait(5)\nstop.wait(0.2)\n")
    assert unbounded_waits(source) == [1, 3, 5]
