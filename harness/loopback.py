"""Where a server started on this machine listens: the loopback address, and a free port on it.

Its own module, on the standard library alone, so that the tests and benchmarks that start an emulator or
a sandbox take ports the same way as the launcher without importing it (the launcher loads Polyaxon).
"""

from __future__ import annotations

import socket

LOCAL_HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback port that nobody listens on now, as the kernel picks it (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOCAL_HOST, 0))
        return probe.getsockname()[1]
