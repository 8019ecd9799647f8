"""The engine's watchdog: SIGTERMs the engine's process group once the launcher is gone, SIGKILLs what is left.

Run as a script under a bare interpreter (`python watchdog.py`, standard library only, nothing of the harness
imported): reads "PGID GRACE" on stdin, then blocks until the launcher closes the pipe or dies.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, then SIGKILL whatever is left after the grace period."""
    if not group_alive(pgid):
        return
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)


def main() -> None:
    line = sys.stdin.readline().split()
    if not line:
        return
    pgid, grace_s = int(line[0]), float(line[1])
    sys.stdin.read()
    stop_group(pgid, grace_s)


if __name__ == "__main__":
    main()
