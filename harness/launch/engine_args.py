"""The engine's command line as words: its options read one way, and one of them set.

vLLM's API server takes `--name value`, `--name=value` and bare flags (`--enforce-eager`,
`--no-enable-prefix-caching`). The launcher reads --port and --model and sets --host and --port; the run
record keeps every option as a limit. They read the words here, so they cannot disagree about what the
engine was told. As with argparse, an option given twice means its last value.
"""

from __future__ import annotations

from typing import Any

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


def engine_port(argv: list[str]) -> int:
    """The engine command's --port (two words or option=value); vLLM's default is 8000."""
    port = option_value(argv, "--port")
    return int(port) if port is not None else VLLM_DEFAULT_PORT


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
    return [*result, option, value]


def _typed(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
