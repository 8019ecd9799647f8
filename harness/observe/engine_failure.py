"""Why a start-up produced no capacity, in the engine's own words: how far it got and the root-cause line.

A failed start prints many errors; most only point back ("see root cause above"). The first specific
exception or argument error is the cause; the error lines around it are kept as evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

import pydantic

from harness.observe.log_lines import LogLine, split_log_lines

TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
# argparse refusing the command line: `api_server.py: error: ...`, or a console script's `prog: error: ...`
ARGUMENT_ERROR = re.compile(r"^\S+: error: .+")
EXCEPTION_LINE = re.compile(r"^(?P<kind>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<text>.*))?$")
FAILURE_MARKERS = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "Engine process failed to start",
    "CUDA out of memory",
    "larger than the maximum number of tokens that can be stored in KV cache",
    "larger than the available KV cache memory",
    "No available memory for the cache blocks",
)
# pydantic states what it refused on the lines after this header ("  Value error, Unknown quantization …").
VALIDATION_HEADER = re.compile(r"ValidationError: \d+ validation errors? for \w+$")
VALIDATION_TYPE_SUFFIX = re.compile(r"\s*\[type=.*$")
# Wrappers that only point at the root cause printed earlier.
GENERIC_FAILURES = ("See root cause above", "Engine core initialization failed", "Engine process failed to start")
MAX_EVIDENCE_LINES = 8

Stage = Literal["starting", "loading_weights", "sizing_kv_cache", "after_kv_cache"]


class EngineFailure(pydantic.BaseModel):
    """Why a start-up produced no capacity: how far it got and the engine's own words."""

    stage: Stage
    error: str | None
    evidence: list[str]


def failure_while(lines: list[LogLine], stage: Stage) -> EngineFailure | None:
    evidence = _error_lines(lines)
    if not evidence:
        return None
    return EngineFailure(stage=stage, error=_root_cause(lines), evidence=evidence[:MAX_EVIDENCE_LINES])


def failure_after_capacity(lines: list[LogLine]) -> EngineFailure | None:
    """A start that sized its cache can still die later (graph capture, warm-up): keep that too."""
    if not any(is_failure_marker(line.message) for line in lines):
        return None
    return EngineFailure(stage="after_kv_cache", error=_root_cause(lines),
                         evidence=_error_lines(lines)[:MAX_EVIDENCE_LINES])


def _error_lines(lines: Iterable[LogLine]) -> list[str]:
    """Error messages, failure markers and exception lines, without the traceback frames between them."""
    evidence: list[str] = []
    in_traceback = False
    for line in lines:
        message = line.message
        if TRACEBACK.search(message):
            in_traceback = True
            continue
        if EXCEPTION_LINE.search(message) or ARGUMENT_ERROR.search(message):
            in_traceback = False
            evidence.append(message)
        elif is_failure_marker(message) or (line.level in ("ERROR", "CRITICAL") and not in_traceback):
            evidence.append(message)
    return list(dict.fromkeys(evidence))


def engine_error_line(log_text: str) -> str | None:
    """The engine's own explanation of why it stopped, from its log as written (prefixes, headers, colour)."""
    return _root_cause(split_log_lines(log_text))


def _root_cause(lines: list[LogLine]) -> str | None:
    """The first specific exception or argument error: later ones usually just say 'see root cause above'.
    Without one, the first failure marker, else the first ERROR line; None when there is none of those."""
    exceptions = [
        _with_validation_detail(lines, index) for index, line in enumerate(lines)
        if EXCEPTION_LINE.search(line.message) or ARGUMENT_ERROR.search(line.message)
    ]
    specific = [text for text in exceptions if not any(generic in text for generic in GENERIC_FAILURES)]
    markers = [line.message for line in lines if is_failure_marker(line.message)]
    errors = [line.message for line in lines if line.level in ("ERROR", "CRITICAL")]
    return next(iter(specific or exceptions or markers or errors), None)


def _with_validation_detail(lines: list[LogLine], index: int) -> str:
    """A pydantic refusal's header names only the model: add what it says was wrong, and of which field
    (the field's name, when there is one, is the line before its reason)."""
    message = lines[index].message
    if not VALIDATION_HEADER.search(message):
        return message
    detail = [line.message.strip() for line in lines[index + 1 : index + 3]]
    detail = [VALIDATION_TYPE_SUFFIX.sub("", text) for text in detail if text and not text.startswith("For further")]
    return ": ".join([message, *detail])


def is_failure_marker(message: str) -> bool:
    return any(marker in message for marker in FAILURE_MARKERS)


def diagnosis(capacity_found: bool, failure: EngineFailure | None, lines: list[LogLine]) -> str:
    if capacity_found:
        return "capacity found" if failure is None else f"capacity found, then the engine failed: {failure.error}"
    if not lines:
        return "no capacity found: the log is empty"
    if failure is not None:
        where = {
            "starting": "before loading the model",
            "loading_weights": "while loading the model weights",
            "sizing_kv_cache": "after loading the weights, while sizing the KV cache",
            "after_kv_cache": "after sizing the KV cache",
        }[failure.stage]
        return f"no capacity found: the engine failed while loading ({where}): {failure.error}"
    if not any(line.level for line in lines):
        return "no capacity found: no vLLM log lines in this text"
    return "no capacity found: the log ends before the engine reported its capacity (truncated, or still starting)"


def later_stage(current: Stage, candidate: Stage) -> Stage:
    order: tuple[Stage, ...] = ("starting", "loading_weights", "sizing_kv_cache", "after_kv_cache")
    return candidate if order.index(candidate) > order.index(current) else current
