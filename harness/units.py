"""Units of memory, defined once for the whole project.

vLLM prints memory in GiB (2**30 bytes), also where it writes "GB" (0.6 and early 0.8 compute it with
2**30).
"""

from __future__ import annotations

GiB = 1 << 30


def gib_to_bytes(printed: str) -> int:
    """A GiB figure as a log prints it ("8.11") in bytes."""
    return round(float(printed) * GiB)
