"""What the engine ran on: the GPU (name, driver, CUDA, memory) where there is one, else the CPU and the
engine's resident memory.

A capacity figure means little without the device it was measured on, and a one-limit comparison must hold
the device fixed like any other limit. GPUs are read with `nvidia-smi` (it ships with the driver, so it is
in every GPU container); a machine without it has no NVIDIA GPU to report.

The memory total recorded is CUDA's, the one vLLM multiplies by `gpu_memory_utilization`: nvidia-smi's
`memory.total` less the driver's `memory.reserved`. On an H200 (driver 580.159.04) nvidia-smi printed
143,771 MiB total and 616 MiB reserved, and `torch.cuda.mem_get_info()` 150,109,880,320 B = 143,155.94 MiB:
the difference, within nvidia-smi's whole MiB. A driver that does not report the reservation leaves
nvidia-smi's total, and the reservation unknown.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel

MIB = 1024 * 1024
GPU_QUERY = ("name", "driver_version", "memory.total", "memory.used")
CUDA_VERSION = re.compile(r"CUDA Version:\s*(\d+(?:\.\d+)?)")


class DeviceFacts(BaseModel):
    """Fixed for the run: dashboard inputs. Memory used is sampled while the load runs (peaks are outputs)."""

    gpu_name: str | None = None
    gpu_count: int | None = None
    gpu_driver_version: str | None = None
    cuda_version: str | None = None
    gpu_memory_total_bytes: int | None = None  # CUDA's total, summed over the GPUs (see the module's docstring)
    gpu_memory_reserved_bytes: int | None = None  # the driver's reservation, outside CUDA's total
    cpu_model: str | None = None
    engine_dtype: str | None = None


class DeviceRecord(DeviceFacts):
    """device.json: the facts, and the peaks of what was sampled while the load ran."""

    peak_gpu_memory_used_bytes: int | None = None
    peak_engine_rss_bytes: int | None = None

    def inputs(self) -> dict[str, Any]:
        return self.model_dump(include=set(DeviceFacts.model_fields), exclude_none=True)

    def outputs(self) -> dict[str, Any]:
        return self.model_dump(exclude=set(DeviceFacts.model_fields), exclude_none=True)


class MemoryMonitor:
    """Samples device memory in a thread of its own: nvidia-smi takes tens of milliseconds, which must not
    land in the event loop that times the requests. With a GPU, its memory in use; without one, the
    engine's resident memory. Each reading goes to `on_reading` as {series name: bytes}."""

    def __init__(self, engine_pid: int | None, interval_s: float,
                 on_reading: Callable[[dict[str, float]], None] | None = None) -> None:
        self.engine_pid = engine_pid
        self.interval_s = interval_s
        self.on_reading = on_reading
        self.on_gpu = bool(_query_gpus(GPU_QUERY))
        self.peaks: dict[str, int] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="memory-monitor", daemon=True)

    def __enter__(self) -> MemoryMonitor:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)

    def read(self) -> dict[str, int]:
        if self.on_gpu:
            used = gpu_memory_used_bytes()
            return {} if used is None else {"gpu_memory_used_bytes": used}
        rss = None if self.engine_pid is None else process_tree_rss_bytes(self.engine_pid)
        return {} if rss is None else {"engine_rss_bytes": rss}

    def _run(self) -> None:
        while True:
            reading = self.read()
            for name, value in reading.items():
                self.peaks[name] = max(value, self.peaks.get(name, 0))
            if reading and self.on_reading is not None:
                self.on_reading({name: float(value) for name, value in reading.items()})
            if self.stopped.wait(self.interval_s):
                return

    def record(self, facts: DeviceFacts) -> DeviceRecord:
        return DeviceRecord(**facts.model_dump(), **{f"peak_{name}": value for name, value in self.peaks.items()})


def device_facts() -> DeviceFacts:
    """The GPUs this process sees, or the CPU when it sees none."""
    gpus = _query_gpus(GPU_QUERY)
    if not gpus:
        return DeviceFacts(cpu_model=cpu_model())
    total_mib = _summed_mib([gpu[2] for gpu in gpus])
    reserved_mib = _reserved_mib(len(gpus))
    return DeviceFacts(
        gpu_name=gpus[0][0],
        gpu_count=len(gpus),
        gpu_driver_version=gpus[0][1],
        cuda_version=_cuda_version(),
        gpu_memory_total_bytes=None if total_mib is None else (total_mib - (reserved_mib or 0)) * MIB,
        gpu_memory_reserved_bytes=None if reserved_mib is None else reserved_mib * MIB,
        cpu_model=cpu_model(),
    )


def gpu_memory_used_bytes() -> int | None:
    """Device memory in use on every GPU this process sees, summed; None without a GPU."""
    used_mib = _summed_mib([gpu[3] for gpu in _query_gpus(GPU_QUERY)])
    return None if used_mib is None else used_mib * MIB


def process_tree_rss_bytes(pid: int) -> int | None:
    """Resident memory of a process and its children (vLLM runs its engine core in a child process)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:  # a child that ended between the listing and the reading
            continue
    return total


def cpu_model() -> str:
    """The CPU's marketing name (Linux's /proc/cpuinfo); elsewhere what the platform says."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def _query_gpus(fields: tuple[str, ...]) -> list[list[str]]:
    """One row per GPU with these fields (memory in MiB); empty without nvidia-smi or a GPU, or where the
    driver does not know a field (nvidia-smi then refuses the whole query)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [[field.strip() for field in line.split(",")] for line in listed.splitlines() if line.strip()]


def _summed_mib(readings: list[str]) -> int | None:
    """The MiB figures summed; None where there are none or one is not a number (`[N/A]`, `[Not Supported]`:
    a GB10's unified memory has no framebuffer figures)."""
    try:
        return sum(int(float(reading)) for reading in readings) if readings else None
    except ValueError:
        return None


def _reserved_mib(gpu_count: int) -> int | None:
    """The driver's reservation on every GPU, summed; None unless nvidia-smi states it for each of them."""
    rows = _query_gpus(("memory.reserved",))
    return _summed_mib([row[0] for row in rows]) if len(rows) == gpu_count else None


def _cuda_version() -> str | None:
    """The CUDA version the driver supports, from nvidia-smi's banner (the query interface does not list it)."""
    try:
        banner = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    match = CUDA_VERSION.search(banner)
    return match.group(1) if match else None
