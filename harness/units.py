"""Units of memory, defined once for the whole project.

vLLM prints memory in GiB (2**30 bytes), also where it writes "GB" (0.6 and early 0.8 compute it with
2**30).
"""

from __future__ import annotations

from harness.errors import HarnessError

GiB = 1 << 30
# vLLM prints no figure past 2**53 (a token count, a block count, bytes of GiB): a longer run of digits in a
# log is damage or a hostile edit, refused before it overflows a float or Python's digit limit downstream
MAX_LOGGED_VALUE = 2**53


def round_up(value: int, multiple: int) -> int:
    """`value` rounded up to a whole number of `multiple`s, as vLLM pads a tensor's dimension or a vocabulary."""
    return -(-value // multiple) * multiple


def logged_figure(printed: str) -> float:
    """A figure as a log prints it ("8.11", "1,024"), refused past what vLLM prints."""
    digits = printed.replace(",", "")
    whole = digits.lstrip("-").split(".")[0]
    if len(whole) > len(str(MAX_LOGGED_VALUE)) or abs(value := float(digits)) > MAX_LOGGED_VALUE:
        raise HarnessError(f"log figure {abbreviated(printed)} is larger than any vLLM prints: the log is damaged "
                           "or edited")
    return value


def abbreviated(printed: str) -> str:
    """A figure short enough for a one-line error: a run of hundreds of digits keeps its first 20 and its length."""
    return printed if len(printed) <= 24 else f"{printed[:20]}… ({len(printed)} characters)"


def logged_count(printed: str) -> int:
    """A whole count as a log prints it ("17,384"), refused past what vLLM prints."""
    logged_figure(printed)
    return int(printed.replace(",", ""))


def gib_to_bytes(printed: str) -> int:
    """A GiB figure as a log prints it ("8.11") in bytes."""
    return round(logged_figure(printed) * GiB)
