"""This host's GPUs: from NVML when a driver answers, else simulated ones.

A simulated GPU is a logical CPU device in the trainer; it is marked `simulated` wherever
it is shown, its memory is nominal and its memory fraction is recorded but not enforced.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from worker.processes import pid_alive

log = logging.getLogger(__name__)

DEFAULT_SIMULATED_GPUS = 4
SIMULATED_MEMORY_MB = 16_384
SIMULATED_NAME = "Simulated GPU (CPU logical device)"
RELEASE_CHECK_INTERVAL_S = 0.5
PROCESS_BUSY_WINDOW_S = 5.0
"""NVML's per-process samples of this long split a shared GPU's utilization between its
processes: several of the driver's sample periods (1/6 to 1 s), short beside the GPU-use
sample period (`TOWERQ_GPU_USE_SAMPLE_S`), so the split is of what the GPU does now."""


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
    process_busy: dict[int, int] | None = None
    """pid -> the SM utilization NVML's per-process samples of the last
    `PROCESS_BUSY_WINDOW_S` add up to for it (a process that ran no kernel has none); None
    where the driver keeps no such samples, or under CUDA MPS (its server runs every
    client's kernels)."""

    def busy_of(self, pids: set[int]) -> float | None:
        """How busy `pids` keep this GPU (None where it does not say): its utilization where
        no other process is on it, else their part of it by NVML's per-process samples; the
        GPU's own figure where those cannot split it (none kept, or no kernel in them)."""
        if self.utilization_pct is None:
            return None
        others = {p["pid"] for p in self.processes} - pids
        total = sum((self.process_busy or {}).values())
        if not others or total <= 0:
            return self.utilization_pct
        theirs = sum(busy for pid, busy in (self.process_busy or {}).items() if pid in pids)
        return self.utilization_pct * theirs / total


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
        processes = self._processes(handle)
        return GpuState(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_mb=int(memory.total // 2**20),
            memory_used_mb=int(memory.used // 2**20),
            utilization_pct=utilization,
            processes=processes,
            process_busy=self._process_busy(handle, processes),
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

    def _process_busy(self, handle: Any, processes: list[dict[str, Any]]) -> dict[int, int] | None:
        """pid -> its SM utilization summed over the driver's samples of the last
        `PROCESS_BUSY_WINDOW_S` ({} where no process ran a kernel then; None where the driver
        or pynvml keeps no per-process samples, or MPS' server is among `processes`)."""
        if any(_is_mps_server(p["pid"]) for p in processes):
            return None
        nvml = self.nvml
        since = int((time.time() - PROCESS_BUSY_WINDOW_S) * 1_000_000)  # the driver's clock: µs of the epoch
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except AttributeError:  # a pynvml without it
            return None
        except nvml.NVMLError as err:
            if getattr(err, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", None):
                return {}  # no sample since: no process ran a kernel
            log.debug("nvmlDeviceGetProcessUtilization failed: %s", err)
            return None
        busy: dict[int, int] = {}
        for sample in samples:
            if int(sample.timeStamp) > since and 0 <= int(sample.smUtil) <= 100:  # past 100: not a figure
                busy[int(sample.pid)] = busy.get(int(sample.pid), 0) + int(sample.smUtil)
        return busy

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


MPS_SERVER = "nvidia-cuda-mps-server"


def _is_mps_server(pid: int) -> bool:
    """Whether `pid` is CUDA MPS' server: under MPS the driver counts its clients' kernels as
    the server's, so per-process samples cannot split the GPU between jobs. Its program, not
    its name (a program sets its own): a file of that name owned by root, which a member's
    program cannot make, so it cannot pass for the server to have the GPU's whole figure."""
    try:
        program = os.readlink(f"/proc/{pid}/exe")
        owner = os.stat(f"/proc/{pid}/exe").st_uid
    except OSError:
        return False
    return os.path.basename(program) == MPS_SERVER and owner == 0


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
