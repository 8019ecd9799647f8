"""The engine's command line as words: its options read one way, and one of them set or dropped.

vLLM's API server takes `--name value`, `--name=value` and bare flags (`--enforce-eager`,
`--no-enable-prefix-caching`). The launcher reads --port and --model, sets --host and --port, and drops
--revision for a model directory; the run record keeps every option as a limit. They read the words here,
so they cannot disagree about what the engine was told. As with argparse, an option given twice means its
last value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.errors import HarnessError

VLLM_DEFAULT_PORT = 8000


def option_words(argv: list[str]) -> list[tuple[str, str | None]]:
    """Each `--option` with its value as written: `--port 8000` and `--port=8000` → ("--port", "8000"), a
    bare flag → ("--enforce-eager", None). A following word is a value unless it starts with `--`."""
    options: list[tuple[str, str | None]] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        if not word.startswith("--"):
            continue
        name, _, value = word.partition("=")
        if not value and index < len(argv) and not argv[index].startswith("--"):
            value, index = argv[index], index + 1
        options.append((name, value or None))
    return options


def option_value(argv: list[str], option: str) -> str | None:
    """The value of `option` (e.g. "--model"): the last one given; None when it is absent or a bare flag."""
    values = [value for name, value in option_words(argv) if name == option]
    return values[-1] if values else None


def is_model_directory(argv: list[str]) -> bool:
    """Whether the engine's --model is a directory on this machine rather than a hub id."""
    model = option_value(argv, "--model")
    return model is not None and Path(model).is_dir()


def engine_port(argv: list[str]) -> int:
    """The engine command's --port (two words or option=value); vLLM's default is 8000. A value no server can
    listen on is refused before anything starts."""
    port = option_value(argv, "--port")
    if port is None:
        return VLLM_DEFAULT_PORT
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise HarnessError(f"engine command --port {port!r}: not a port (1-65535)")
    return int(port)


def engine_options(argv: list[str]) -> dict[str, Any]:
    """The engine's options as named values: `--max-num-seqs 8` → max_num_seqs=8, `--no-x` → x=False."""
    options: dict[str, Any] = {}
    for name, value in option_words(argv):
        key = name[2:].replace("-", "_")
        if value is None:
            key, typed = (key[3:], False) if key.startswith("no_") else (key, True)
            options[key] = typed
        else:
            options[key] = _typed(value)
    return options


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """`argv` with `option` set to `value` (at the end), whether it was given as two words, as
    option=value, or not at all."""
    return [*without_option(argv, option), option, value]


def without_option(argv: list[str], option: str) -> list[str]:
    """`argv` without `option` and its value, whether given as two words, as option=value, or as a flag."""
    result: list[str] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        if word == option:
            if index < len(argv) and not argv[index].startswith("--"):
                index += 1  # its value, by the same rule as option_words
        elif not word.startswith(option + "="):
            result.append(word)
    return result


def _typed(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
