"""Compile and validate the project's polyaxonfiles with Polyaxon's own compiler.

`polyaxon check` accepts a sweep whose matrix holds a wrong type or an out-of-range value (the run fails
later, server-side), so every sweep point is compiled here with the same compiler before anything starts.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.polyaxon_client import quiet_polyaxon

quiet_polyaxon()  # before polyaxon is imported

from polyaxon.exceptions import PolyaxonfileError  # noqa: E402
from polyaxon.polyaxonfile import (  # noqa: E402
    CompiledOperationSpecification,
    OperationSpecification,
    check_polyaxonfile,
)
from polyaxon.schemas import V1Operation  # noqa: E402
from polyaxon.tuners.grid_search import GridSearchManager  # noqa: E402
from polyaxon.tuners.mapping import MappingManager  # noqa: E402

from harness.errors import HarnessError  # noqa: E402
from harness.launch.extra_engine_args import check_extra_args  # noqa: E402

Params = Mapping[str, object]

# The environment variable the containers' shell line appends to the engine's words (see RenderedRun.argv).
EXTRA_ARGS_ENV = "HARNESS_ENGINE_EXTRA_ARGS"


@dataclass(frozen=True)
class RenderedRun:
    """What Polyaxon would hand to Kubernetes for one run: the container and the resolved inputs."""

    kind: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    ports: list[int]
    inputs: dict[str, Any]
    gpu_limit: int | None
    node_selector: dict[str, str]
    termination_timeout_s: int | None
    collect_logs: bool
    matrix_points: list[dict[str, Any]] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        """The program the container ends up running, as words.

        The project's containers run `sh -c LINE NAME WORD...`: the line (which no input reaches) installs
        what the image lacks, drops the empty words of unset inputs and execs the words, then the
        allow-listed `HARNESS_ENGINE_EXTRA_ARGS` split on spaces. Those are the words returned here.
        """
        if self.command not in (["/bin/sh", "-c"], ["sh", "-c"]):
            return [*self.command, *self.args]
        if len(self.args) < 3:
            raise HarnessError(f"expected sh -c LINE NAME WORD... (each input a word of its own), not a shell line "
                               f"holding the command: {self.args[:1]}")
        extra = self.env.get(EXTRA_ARGS_ENV, "").split() if f"${EXTRA_ARGS_ENV}" in self.args[0] else []
        return [word for word in self.args[2:] if word] + extra


def load_operation(polyaxonfiles: Sequence[Path], params: Params | None = None) -> V1Operation:
    """Read a polyaxonfile plus presets (later files patch earlier ones) into one checked operation."""
    files = [Path(path) for path in polyaxonfiles]
    if not files:
        raise HarnessError("no polyaxonfile given")
    for path in files:
        if not path.is_file():
            raise HarnessError(f"{path}: no such polyaxonfile")
    try:
        with _quiet_serializer():
            return check_polyaxonfile(
                polyaxonfile=[str(path) for path in files],
                params=dict(params or {}),
                strict_params=True,
                is_cli=False,
                verbose=False,
            )
    except PolyaxonfileError as error:
        reason = _cause(error)
        if "non optional inputs" in reason:
            reason = f"missing required input(s) {', '.join(_missing_inputs(files, params or {}))}; pass -P name=value"
        raise HarnessError(f"{_describe(files)}: {reason}") from None


def declared_inputs(polyaxonfiles: Sequence[Path]) -> dict[str, str]:
    """The inputs a polyaxonfile (+ presets) declares and their types, whether or not params would satisfy them."""
    files = [Path(path) for path in polyaxonfiles]
    for path in files:
        if not path.is_file():
            raise HarnessError(f"{path}: no such polyaxonfile")
    try:
        with _quiet_serializer():
            operation = check_polyaxonfile(polyaxonfile=[str(path) for path in files], is_cli=False, verbose=False,
                                           validate_params=False)
            compiled = OperationSpecification.compile_operation(operation)
    except Exception as error:  # the compiler raises several types; each is a bad spec, not a bug here
        raise HarnessError(f"{_describe(files)}: {_cause(error)}") from None
    return {io.name: str(io.type) for io in compiled.inputs or []}


# How a -P value for a number must be written. Polyaxon's own conversion reads `1e3` as the int 1000, `true`
# as 1 and `8\n` as 8: a value that is not written as a number of its type is refused instead.
NUMBER_WORDS = {
    "int": re.compile(r"-?[0-9]+\Z"),
    "float": re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?\Z"),
}


def _refuse_loose_numbers(files: list[Path], params: Params) -> None:
    """Only values given as text are read here (`-P name=value`, or a sweep point written as a string)."""
    if not any(isinstance(value, str) for value in params.values()):
        return
    types = declared_inputs(files)
    for name, value in params.items():
        kind = types.get(name, "")
        if isinstance(value, str) and kind in NUMBER_WORDS and not NUMBER_WORDS[kind].match(value):
            expected = "a whole number" if kind == "int" else "a decimal number"
            raise HarnessError(f"{_describe(files)}: input {name}: {value!r} is not {expected}")


def overridden_params(polyaxonfiles: Sequence[Path], params: Params) -> list[str]:
    """-P values that no point uses, because every point of the file's sweep sets that input itself."""
    points = render(polyaxonfiles, params).matrix_points
    return [name for name in params if points and all(name in point for point in points)]


def _missing_inputs(files: list[Path], params: Params) -> list[str]:
    """Polyaxon says that some required input is missing, not which: read the declarations to name them."""
    with _quiet_serializer():
        operation = check_polyaxonfile(
            polyaxonfile=[str(path) for path in files],
            params=dict(params),
            is_cli=False,
            verbose=False,
            validate_params=False,
        )
        compiled = OperationSpecification.compile_operation(operation)
    given = set(operation.params or {})
    return [io.name for io in compiled.inputs or [] if not io.is_optional and io.name not in given]


def render(
    polyaxonfiles: Sequence[Path], params: Params | None = None, run_globals: Mapping[str, Any] | None = None
) -> RenderedRun:
    """Compile, apply params and contexts, and return the container as it would run."""
    files = [Path(path) for path in polyaxonfiles]
    if params and "extra_args" in params:  # Polyaxon would print the whole allow-list's regex instead
        try:
            check_extra_args(str(params["extra_args"]))
        except HarnessError as error:
            raise HarnessError(f"{_describe(files)}: {error}") from None
    _refuse_loose_numbers(files, params or {})
    operation = load_operation(files, params)
    matrix_points = _matrix_points(operation, files)
    if operation.matrix is not None:
        operation.matrix = None  # the points are rendered one by one by check_sweep
    contexts = {"globals": dict(run_globals or {})}
    try:
        with _quiet_serializer():
            compiled = OperationSpecification.compile_operation(operation)
            compiled = CompiledOperationSpecification.apply_params(compiled, params=operation.params, context=contexts)
            compiled = CompiledOperationSpecification.apply_operation_contexts(compiled, contexts=contexts)
            compiled = CompiledOperationSpecification.apply_runtime_contexts(compiled, contexts=contexts)
    except Exception as error:  # the compiler raises several types; each is a bad spec, not a bug here
        raise HarnessError(f"{_describe(files)}: {_cause(error)}") from None
    inputs = {io.name: io.value for io in compiled.inputs or []}
    for point in matrix_points or [{}]:  # a matrix may set the load itself (polyaxonfiles/search-grid.yaml)
        _check_load_shape({**inputs, **point}, files)
    run = compiled.run
    container = run.container
    resources = container.resources if isinstance(container.resources, dict) else {}
    limits = resources.get("limits") or {}
    plugins = compiled.plugins
    termination = compiled.termination
    return RenderedRun(
        kind=run.kind,
        image=container.image,
        command=[str(word) for word in container.command or []],
        args=[str(word) for word in container.args or []],
        env=dict(pair for pair in map(_env_pair, container.env or []) if pair is not None),
        ports=list(getattr(run, "ports", None) or []),
        inputs=inputs,
        gpu_limit=int(limits["nvidia.com/gpu"]) if "nvidia.com/gpu" in limits else None,
        node_selector=dict(run.environment.node_selector or {}) if run.environment else {},
        termination_timeout_s=termination.timeout if termination else None,
        collect_logs=bool(plugins and plugins.collect_logs),
        matrix_points=matrix_points,
    )


def check_files(polyaxonfiles: Sequence[Path], params: Params | None = None) -> list[dict[str, Any]]:
    """Validate a file (+ presets) with params; a sweep is validated point by point and its points returned."""
    files = [Path(path) for path in polyaxonfiles]
    rendered = render(files, params)
    if not rendered.matrix_points:
        return []
    return check_sweep(files, rendered.matrix_points, params or {})


def check_sweep(
    polyaxonfiles: Sequence[Path], points: list[dict[str, Any]], params: Params
) -> list[dict[str, Any]]:
    """Compile every point and refuse a sweep that changes more than one limit."""
    sweep_file = Path(polyaxonfiles[0])
    swept: str | None = None
    for index, point in enumerate(points):
        if not point:
            raise HarnessError(f"{sweep_file}: point {index} sets no input; a sweep varies exactly one limit")
        for name in point:
            if swept is None:
                swept = name
            elif name != swept:
                raise HarnessError(
                    f"{sweep_file}: point {index} changes '{name}' besides '{swept}'; "
                    "a sweep varies exactly one limit"
                )
        try:
            render(polyaxonfiles, {**params, **point})
        except HarnessError as error:
            reason = str(error).removeprefix(f"{_describe([Path(path) for path in polyaxonfiles])}: ")
            raise HarnessError(f"{sweep_file}: point {index} {point}: {reason}") from None
    return [{**params, **point} for point in points]


def _check_load_shape(inputs: dict[str, Any], files: list[Path]) -> None:
    """The harness drives either a closed loop or an open one; Polyaxon cannot say "exactly one of"."""
    if {"concurrency", "rate"} <= inputs.keys() and (inputs["concurrency"] is None) == (inputs["rate"] is None):
        raise HarnessError(f"{_describe(files)}: set exactly one of 'concurrency' (closed loop) or 'rate' (open loop)")


def _matrix_points(operation: V1Operation, files: list[Path]) -> list[dict[str, Any]]:
    """Expand the matrix with Polyaxon's own tuners; only exhaustive kinds can be checked up front."""
    matrix = operation.matrix
    if matrix is None:
        return []
    managers = {"mapping": MappingManager, "grid": GridSearchManager}
    if matrix.kind not in managers:
        raise HarnessError(f"{files[0]}: matrix kind '{matrix.kind}' cannot be checked point by point; "
                           "use mapping or grid")
    points = managers[matrix.kind](matrix).get_suggestions()
    return [{name: _plain(value) for name, value in point.items()} for point in points]


@contextmanager
def _quiet_serializer() -> Iterator[None]:
    """Polyaxon's own to_dict trips pydantic serializer warnings on input validations, and its client logs a
    stack trace before raising (a `hubRef` it cannot fetch); the error it raises is reported in one line."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Pydantic serializer warnings", category=UserWarning)
        logging.disable(logging.CRITICAL)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def _env_pair(item: Any) -> tuple[str, str] | None:
    """A literal env entry as (name, value); None for one filled from a secret (`valueFrom`), which only the
    cluster can fill: locally the value comes from this environment. Entries stay plain dicts or become
    Kubernetes objects depending on how they were written."""
    if isinstance(item, Mapping):
        return None if "valueFrom" in item else (str(item["name"]), str(item.get("value", "")))
    return None if getattr(item, "value_from", None) is not None else (str(item.name), str(item.value))


def _plain(value: Any) -> Any:
    """Grid suggestions arrive as numpy scalars; params want plain Python values."""
    return value.item() if hasattr(value, "item") else value


def _cause(error: BaseException) -> str:
    """Polyaxon wraps the useful message; walk down to the innermost one and keep its first line."""
    while error.__cause__ is not None:
        error = error.__cause__
    message = str(error).strip() or type(error).__name__
    return message.splitlines()[0]


def _describe(files: list[Path]) -> str:
    return " + ".join(str(path) for path in files)


def parse_param_options(options: Sequence[str]) -> dict[str, str]:
    """`-P name=value` words into params; Polyaxon converts each value to its input's declared type."""
    params: dict[str, str] = {}
    for option in options:
        name, separator, value = option.partition("=")
        if not separator or not name:
            raise HarnessError(f"-P {option}: expected name=value")
        if name in params:
            raise HarnessError(f"-P {option}: '{name}' is given twice")
        params[name] = value
    return params
