"""A fake `pynvml` for tests (put this folder first on a worker's PYTHONPATH): it reports the
GPUs `FAKE_NVML_GPUS` names (their memory in MiB, comma-separated, e.g. "81559,81559"; their
UUIDs name `FAKE_NVML_HOST`, where several workers run on this machine), and
as each GPU's processes, the live processes that have `FAKE_GPU_MB=<MiB>` in their
environment, on the GPUs of their `CUDA_VISIBLE_DEVICES`, using that much memory each, and
keeping each of them busy `FAKE_GPU_BUSY` percent of the time (0 unless said; a GPU's
utilization is its holders' sum, at most 100, and each busy holder has a per-process sample
of its own percent, as NVML keeps them). A process counts only when no child of it has
the variable too (bwrap and setpriv pass their environment on: the program at the end of the
chain holds the memory).

So a test says what a program holds with the job's own `env`, and the worker reads it by
host pid, as it reads the real NVML."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def _totals() -> list[int]:
    return [int(mb) for mb in os.environ.get("FAKE_NVML_GPUS", "").split(",") if mb.strip()]


def nvmlInit() -> None:
    if not _totals():
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # FAKE_NVML_GPUS names no GPU


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_totals())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetMinorNumber(handle: int) -> int:
    return handle


def nvmlDeviceGetName(handle: int) -> str:
    return "Fake NVIDIA H100 80GB HBM3"


def nvmlDeviceGetUUID(handle: int) -> str:
    host = os.environ.get("FAKE_NVML_HOST")  # several workers on this machine: each its own GPUs
    return f"GPU-fake-{host}-{handle:04d}" if host else f"GPU-fake-{handle:04d}"


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    busy = sum(held.busy for held in _holders().values() if handle in held.indices)
    return SimpleNamespace(gpu=min(100, busy), memory=0)


def nvmlDeviceGetProcessUtilization(handle: int, last_seen_us: int) -> list[SimpleNamespace]:
    """A sample now (µs of the epoch) of each process that keeps this GPU busy; NOT_FOUND
    where none does, as the driver says it."""
    now = int(time.time() * 1_000_000)
    samples = [
        SimpleNamespace(pid=pid, timeStamp=now, smUtil=held.busy, memUtil=0, encUtil=0, decUtil=0)
        for pid, held in sorted(_holders().items())
        if handle in held.indices and held.busy > 0 and now > last_seen_us
    ]
    if not samples:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return samples


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


def _parent(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])


def _holders() -> dict[int, SimpleNamespace]:
    """pid -> (MiB, GPU indices, busy percent) of the processes that say they hold GPU memory."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        env = _environ(int(name))
        if "FAKE_GPU_MB" in env and env.get("CUDA_VISIBLE_DEVICES"):
            indices = [int(i) for i in env["CUDA_VISIBLE_DEVICES"].split(",") if i.strip().isdigit()]
            busy = int(env.get("FAKE_GPU_BUSY", "0"))
            found[int(name)] = SimpleNamespace(mb=int(env["FAKE_GPU_MB"]), indices=indices, busy=busy)
    parents = {_parent(pid) for pid in found}
    return {pid: held for pid, held in found.items() if pid not in parents}


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(pid=pid, usedGpuMemory=held.mb * 2**20)
        for pid, held in sorted(_holders().items())
        if handle in held.indices
    ]


def nvmlDeviceGetGraphicsRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return []


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    total = _totals()[handle] * 2**20
    used = sum(p.usedGpuMemory for p in nvmlDeviceGetComputeRunningProcesses(handle)) + 480 * 2**20
    return SimpleNamespace(total=total, used=min(used, total), free=max(0, total - used))
