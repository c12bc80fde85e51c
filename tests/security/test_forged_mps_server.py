"""A member's program cannot pass for CUDA MPS' server. Under MPS the driver counts every
client's kernels as the server's, so where the server is on a GPU the worker does not split
the GPU's use between its processes and gives each job the GPU's whole figure. A program
that named itself so (its own binary of that name, as the sandbox's user `nobody`) would,
beside a busy neighbour, have its GPU held idle read as busy: no idle warning, no idle stop.
Only a root-owned binary of that name counts (the driver's, installed by root)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.test_command_jobs import FAKE_NVML
from worker.gpu_use import gpus_in_use
from worker.inventory import MPS_SERVER, GpuState, NvmlInventory

NOBODY = 65534


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tests/fakenvml's driver with one GPU: a process's FAKE_GPU_MB and FAKE_GPU_BUSY say
    what it holds there and how busy it keeps it."""
    monkeypatch.setenv("FAKE_NVML_GPUS", "81559")
    spec = importlib.util.spec_from_file_location("fake_pynvml_mps", FAKE_NVML / "pynvml.py")
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    return fake


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder `nobody` reaches (pytest's own are root's alone)."""
    made = Path(tempfile.mkdtemp(prefix="towerq-mps-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def on_gpu(command: list[str], busy: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "FAKE_GPU_MB": "500", "FAKE_GPU_BUSY": str(busy)}
    return subprocess.Popen(command, env=env)


def gpu_once(inventory: NvmlInventory, count: int) -> GpuState:
    """GPU 0 once `count` processes are on it."""
    deadline = time.monotonic() + 10
    while len((gpu := inventory.refresh()[0]).processes) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return gpu


def test_a_program_of_its_own_named_as_the_mps_server_does_not_hide_its_idle_gpu(
    fake_nvml: ModuleType, folder: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs the forged server as nobody: needs root")
    forged = folder / MPS_SERVER  # the member's own binary, the server's name
    shutil.copy(shutil.which("sleep") or "/bin/sleep", forged)
    os.chown(forged, NOBODY, NOBODY)
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    neighbour = on_gpu(["sleep", "30"], busy=60)
    idle = on_gpu([*as_nobody, str(forged), "30"], busy=0)
    try:
        gpu = gpu_once(NvmlInventory(fake_nvml), 2)
        assert {p["pid"] for p in gpu.processes} == {neighbour.pid, idle.pid}, gpu.processes
        assert gpu.utilization_pct == 60 and gpu.process_busy == {neighbour.pid: 60}, gpu  # split as ever
        assert gpu.busy_of({idle.pid}) == 0.0  # its own part: idle, not the neighbour's 60
        assert not gpus_in_use([gpu], [0], 0.4, {idle.pid})
    finally:
        for child in (neighbour, idle):
            child.kill()
            child.wait()
