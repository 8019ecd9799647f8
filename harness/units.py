"""Units of memory, defined once for the whole project.

vLLM prints memory in GiB (2**30 bytes), also where it writes "GB" (0.6 and early 0.8 compute it with
2**30). harness.budget re-exports GiB, so modules that import it from there keep working.
"""

from __future__ import annotations

GiB = 1 << 30
