"""This host's GPUs: from NVML when a driver answers, else simulated ones.

A simulated GPU is a logical CPU device in the trainer; it is marked `simulated` wherever
it is shown, its memory is nominal and its memory fraction is recorded but not enforced.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from worker.processes import pid_alive

log = logging.getLogger(__name__)

DEFAULT_SIMULATED_GPUS = 4
SIMULATED_MEMORY_MB = 16_384
SIMULATED_NAME = "Simulated GPU (CPU logical device)"
RELEASE_CHECK_INTERVAL_S = 0.5


@dataclass
class GpuState:
    index: int
    uuid: str
    name: str
    memory_total_mb: int
    memory_used_mb: int = 0
    utilization_pct: float | None = None
    simulated: bool = False
    processes: list[dict[str, Any]] = field(default_factory=list)
    """[{"pid": int, "used_mb": int | None}] of the compute processes on this GPU."""


class Inventory:
    """The GPUs of this host; `refresh()` re-reads memory, utilization and processes."""

    simulated: bool

    def gpus(self) -> list[GpuState]:
        raise NotImplementedError

    def refresh(self) -> list[GpuState]:
        return self.gpus()

    def pids_on(self, indices: list[int]) -> set[int]:
        """Process ids that use any of these GPUs now."""
        wanted = set(indices)
        return {p["pid"] for g in self.refresh() if g.index in wanted for p in g.processes}

    def wait_released(self, pids: set[int], indices: list[int], timeout: float) -> bool:
        """Wait until none of `pids` uses any of these GPUs; False if one still does after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while pids & self.pids_on(indices):
            if time.monotonic() > deadline:
                return False
            time.sleep(RELEASE_CHECK_INTERVAL_S)
        return True

    def close(self) -> None:
        """Release the driver handle, if any."""


class SimulatedInventory(Inventory):
    """`count` simulated GPUs; their processes are the trainers this worker runs on them."""

    simulated = True

    def __init__(self, host: str, count: int) -> None:
        self.host = host
        self.count = count
        self.processes: dict[int, set[int]] = {}

    def gpus(self) -> list[GpuState]:
        return [
            GpuState(
                index=i,
                uuid=f"SIM-{self.host}-{i}",
                name=SIMULATED_NAME,
                memory_total_mb=SIMULATED_MEMORY_MB,
                simulated=True,
                processes=[{"pid": pid, "used_mb": None} for pid in sorted(self._alive(i))],
            )
            for i in range(self.count)
        ]

    def attach(self, pid: int, indices: list[int]) -> None:
        for i in indices:
            self.processes.setdefault(i, set()).add(pid)

    def _alive(self, index: int) -> set[int]:
        pids = self.processes.get(index, set())
        alive = {pid for pid in pids if pid_alive(pid)}
        self.processes[index] = alive
        return alive


class NvmlInventory(Inventory):
    """GPUs as NVML reports them, indexed in PCI bus order (`CUDA_DEVICE_ORDER=PCI_BUS_ID`)."""

    simulated = False

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def gpus(self) -> list[GpuState]:
        return [self._read(i, handle) for i, handle in enumerate(self.handles)]

    def _read(self, index: int, handle: Any) -> GpuState:
        nvml = self.nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: float | None = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError:
            utilization = None
        return GpuState(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mb=int(memory.total // 2**20),
            memory_used_mb=int(memory.used // 2**20),
            utilization_pct=utilization,
            processes=self._processes(handle),
        )

    def _processes(self, handle: Any) -> list[dict[str, Any]]:
        nvml = self.nvml
        found: dict[int, int | None] = {}
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                for proc in getattr(nvml, getter)(handle):
                    used = getattr(proc, "usedGpuMemory", None)
                    found[int(proc.pid)] = int(used // 2**20) if isinstance(used, int) else None
            except nvml.NVMLError as err:
                log.debug("%s failed: %s", getter, err)
        return [{"pid": pid, "used_mb": used} for pid, used in sorted(found.items())]

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NoGpusError(RuntimeError):
    """A GPU host (`TOWERQ_REQUIRE_GPUS`) finds no GPU: a worker must not train on the CPU."""


def open_nvml() -> tuple[Any | None, str]:
    """The initialised `pynvml` module, or None and why there is no usable driver."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            pynvml.nvmlShutdown()
            return None, "the NVIDIA driver sees no GPU"
    except pynvml.NVMLError as err:
        return None, f"no NVIDIA driver answers ({err})"
    return pynvml, ""


def detect(host: str, simulated_gpus: int | None, require_gpus: bool = False) -> Inventory:
    """NVML GPUs, unless `simulated_gpus` is set or no driver answers (then 4 simulated).

    With `require_gpus` (a GPU deployment) a missing driver is an error instead: inside a
    container started without the NVIDIA runtime, the fallback would train on the CPU.
    """
    if require_gpus and simulated_gpus is not None:
        raise NoGpusError("TOWERQ_REQUIRE_GPUS and TOWERQ_SIMULATED_GPUS are both set: choose one")
    if simulated_gpus is None:
        nvml, why = open_nvml()
        if nvml is not None:
            return NvmlInventory(nvml)
        if require_gpus:
            raise NoGpusError(
                f"TOWERQ_REQUIRE_GPUS is set but {why}: check the driver (nvidia-smi) and, in a container, "
                "the NVIDIA runtime and the GPU reservation"
            )
        log.info("%s: using simulated GPUs", why)
        simulated_gpus = DEFAULT_SIMULATED_GPUS
    return SimulatedInventory(host, simulated_gpus)
