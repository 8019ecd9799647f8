"""Secrets out of everything the harness writes or prints: command lines, URLs and the engine's log lines.

An engine's key reaches the harness in VLLM_API_KEY or on the engine's command line (`--api-key`), and
vLLM releases before 0.2x print it among their "non-default args". Record files, tracked inputs, the
report and error lines pass through here before they are written. Two nets: known shapes are masked
wherever they appear (a secret option's value, a URL's password, a bearer token, a secret-named field of a
logged dict or config), and a secret this process has met (a masked option's value, the value of a
secret-named environment variable) is masked wherever its text appears, as in an argparse error quoting it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.errors import HarnessError

MASK = "***"
WORDS_ANYWHERE = {"password", "passwd", "secret"}  # not "credentials": `--allow-credentials` is a CORS switch
LAST_WORDS = {"key", "token", "apikey"}  # `--api-key`, `--hf-token`; not `--max-tokens`, `--tokenizer`
# Shorter values are masked only where their shape shows them: masking a short word everywhere would
# garble the text around it.
MIN_LITERAL_CHARS = 8
HARMLESS_VALUES = {"", "none", "null", "true", "false", MASK}

_met: set[str] = set()

OPTION = re.compile(r"(?P<flag>--[A-Za-z0-9][\w-]*)(?P<sep>=|[ \t]+)(?P<value>(?!--)[^\s'\",\[\]|]*\w[^\s'\",\[\]|]*)")
USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@'\"]*):(?P<password>[^\s/@'\"]+)@")
BEARER = re.compile(r"(?P<head>\b[Bb]earer\s+)(?P<value>[^\s'\",;]+)")
# A field's text or list of texts: a figure such as `arrival_instants_per_token` holds a number, never a secret.
QUOTED_FIELD = re.compile(
    r"(?P<head>(?P<q>['\"])(?P<name>[\w-]+)(?P=q)\s*:\s*)(?P<value>'[^']*'|\"[^\"]*\"|\[[^\]]*\])")
ASSIGNMENT = re.compile(r"(?P<head>\b(?P<name>[A-Za-z_][\w]*)=)(?P<value>'[^']*'|\"[^\"]*\"|[^\s,)]+)")


def is_secret_name(name: str) -> bool:
    """`--api-key`, `hf_token`, `VLLM_API_KEY`, `db-password`, `s3_access_key_id`: names whose values are secret."""
    words = [word for word in re.split(r"[-_\s]+", name.strip("-").lower()) if word]
    if not words:
        return False
    if words[-2:-1] == ["per"]:  # a rate: `kv_bytes_per_token`
        return False
    return words[-1] in LAST_WORDS or words[-2:] == ["key", "id"] or bool(WORDS_ANYWHERE.intersection(words))


def remember(value: str) -> None:
    """A secret met in one place is masked in every text after: the engine may echo it anywhere."""
    if len(value) >= MIN_LITERAL_CHARS and value.lower() not in HARMLESS_VALUES:
        _met.add(value)


def known_secrets() -> list[str]:
    """Secrets met so far and those in secret-named environment variables, longest first."""
    from_env = {value for name, value in os.environ.items() if is_secret_name(name)
                and len(value) >= MIN_LITERAL_CHARS and value.lower() not in HARMLESS_VALUES}
    return sorted(_met | from_env, key=len, reverse=True)


def redact_text(text: str) -> str:
    """`text` with every secret this module can see masked as `***`: the shapes first, so that a value one
    of them shows is masked everywhere else in the same text too."""
    text = redact_url(text)
    text = BEARER.sub(lambda m: m["head"] + _remembered(m["value"]), text)
    text = OPTION.sub(_masked_option, text)
    text = QUOTED_FIELD.sub(_masked_field, text)
    text = ASSIGNMENT.sub(_masked_field, text)
    for secret in known_secrets():
        text = text.replace(secret, MASK)
    return text


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with each secret option's values masked (`--api-key K1 K2`, `--hf-token=T`): every
    word after a secret option up to the next option is its value, as argparse takes `--api-key`'s. The
    values are remembered, so the engine's log is masked of them too; other words pass through `redact_text`."""
    masked: list[str] = []
    in_secret = False
    for word in argv:
        if word.startswith("--"):
            flag, equals, value = word.partition("=")
            in_secret = is_secret_name(flag) and not equals
            if is_secret_name(flag) and equals:
                remember(value)
                word = f"{flag}={MASK}"
            masked.append(word if is_secret_name(flag) else redact_text(word))
        elif in_secret:
            remember(word)
            masked.append(MASK)
        else:
            masked.append(redact_text(word))
    return masked


def secret_free(values: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping (limits, tracked inputs) without its secret-named entries and with its text values masked."""
    return {name: redact_text(value) if isinstance(value, str) else value
            for name, value in values.items() if not is_secret_name(name)}


def redact_file(path: Path) -> None:
    """Mask a file in place (an engine's log, written by the engine itself while it ran); bytes that are not
    UTF-8 are kept as they were."""
    if not path.is_file():
        return
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    masked = redact_text(text)
    if masked != text:
        path.write_bytes(masked.encode("utf-8", errors="surrogateescape"))


def redact_url(url: str) -> str:
    """The URL (or any text) with the password of each user info masked: `http://u:***@host:8000`."""
    return USERINFO.sub(lambda m: f"{m['head']}:{_remembered(m['password'])}@", url)


def refuse_url_credentials(url: str, option: str) -> None:
    """A URL holding a user name or password is refused: the harness sends the engine's key from
    VLLM_API_KEY only, and a URL is recorded and printed in many places."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at:
        remember(userinfo)
        remember(userinfo.partition(":")[2])
        shown = parts._replace(netloc=f"{MASK}@{host}").geturl()
        raise HarnessError(f"{option} {shown}: holds user info; put the engine's key in VLLM_API_KEY "
                           "and give the URL without it")


def _remembered(value: str) -> str:
    remember(value)
    return MASK


def _masked_option(match: re.Match[str]) -> str:
    flag, value = match["flag"], match["value"]
    if not is_secret_name(flag) or value == flag.lstrip("-").upper().replace("-", "_"):  # argparse's metavar
        return match[0]
    remember(value)
    return f"{flag}{match['sep']}{MASK}"


def _masked_field(match: re.Match[str]) -> str:
    """`'api_key': 'K'` → `'api_key': '***'`, `'api_key': ['K']` → `'api_key': ['***']`: still a literal, so
    the rest of a logged args dict stays readable."""
    raw = match["value"]
    items = re.findall(r"'([^']*)'|\"([^\"]*)\"", raw) if raw.startswith("[") else [(raw.strip("'\""), "")]
    values = [single or double for single, double in items]
    if not is_secret_name(match["name"]) or all(value.lower() in HARMLESS_VALUES for value in values):
        return match[0]
    for value in values:
        remember(value)
    quote = next((char for char in raw if char in "'\""), "")
    masked = f"{quote}{MASK}{quote}"
    return f"{match['head']}[{masked}]" if raw.startswith("[") else f"{match['head']}{masked}"
