"""A job's GPU use (`worker.gpu_use`, `Job.gpu_use_summary`): the mean busy share over its
samples and GPUs, the most its own processes held on one GPU (a neighbour's processes on a
shared GPU are not its own), nothing from GPUs that do not say how busy they are, and every
attempt's and rank's figures summed up weighted by their samples and GPUs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from service.core.models.jobs import gpu_use_summary, idle_text
from tests.test_command_jobs import FAKE_NVML
from worker.gpu_use import GpuUseSampler, gpus_in_use
from worker.inventory import MPS_SERVER, PROCESS_BUSY_WINDOW_S, GpuState, Inventory, NvmlInventory, SimulatedInventory


def gpu(index: int, busy: float | None, processes: list[tuple[int, int | None]]) -> GpuState:
    held = [{"pid": pid, "used_mb": used} for pid, used in processes]
    return GpuState(index, f"GPU-{index}", "H100", 81559, utilization_pct=busy, processes=held)


def test_the_busy_share_is_the_mean_over_samples_and_gpus_and_the_peak_is_its_own_processes() -> None:
    sampler = GpuUseSampler(rank=0, indices=[0, 1], every_s=10)
    others = gpu(2, 100, [(99, 70000)])  # a GPU not its own
    assert sampler.sample([gpu(0, 20, [(10, 1000), (11, 50000)]), gpu(1, 60, [(10, 3000)]), others], {10})
    assert sampler.sample([gpu(0, 100, [(10, 2000)]), gpu(1, 100, [(10, 2500), (12, 500)])], {10, 12})
    figures = sampler.figures()
    assert figures is not None
    assert (figures.samples, figures.busy_pct, figures.gpus) == (2, 70.0, 2)  # (40 + 100) / 2
    assert (figures.memory_peak_mb, figures.memory_total_mb) == (3000, 81559)  # 2,500 + 500 is less


def test_the_first_sample_comes_a_period_after_its_process_started() -> None:
    sampler = GpuUseSampler(rank=0, indices=[0], every_s=10)
    later = time.monotonic() + 600  # it waited ten minutes for the other ranks, its folder
    sampler.started(later)
    assert sampler.take(Driver(), {10}, later + 1) is None  # its program is starting
    assert sampler.take(Driver(), {10}, later + 10) is not None


def test_gpus_idle_for_the_labs_stop_time_stop_the_job_once() -> None:
    stopped: list[str] = []
    driver = Driver()
    sampler = GpuUseSampler(rank=0, indices=[0], every_s=10, idle_stop_s=60, stop=stopped.append)
    start = sampler.next_at = float(int(sampler.next_at))  # whole seconds: sums exact
    for t in (0, 10, 20, 30):
        sampler.take(driver, {10}, start + t)
    driver.busy = 50.0  # busy again: the idle stretch starts over
    sampler.take(driver, {10}, start + 40)
    driver.busy = 0.0
    for t in range(50, 110, 10):
        sampler.take(driver, {10}, start + t)
    assert stopped == []  # idle 50 s of the new stretch
    for t in (110, 120, 130):
        sampler.take(driver, {10}, start + t)
    assert stopped == [
        "stopped: its GPUs were idle for 1m (busy under 5% at every sample; the lab stops a job whose GPUs stay "
        "idle 1m: TOWERQ_GPU_IDLE_STOP_S)"
    ]  # once
    never = GpuUseSampler(rank=0, indices=[0], every_s=10, idle_stop_s=0, stop=stopped.append)  # 0: never
    for t in range(0, 600, 10):
        never.take(driver, {10}, never.next_at + t)
    assert len(stopped) == 1


def test_a_rank_of_a_job_over_several_hosts_says_its_gpus_are_idle_past_the_stop_time_and_stops_nothing() -> None:
    """Without `stop` (a rank of a gang: towerq stops the job once every rank says so), its
    figures carry since when its GPUs have been idle, once that has lasted the stop time, and
    drop it again at the first busy sample."""
    driver = Driver()
    sampler = GpuUseSampler(rank=1, indices=[0], every_s=10, idle_warn_s=600, idle_stop_s=60)
    start = sampler.next_at = float(int(sampler.next_at))
    first = sampler.take(driver, {10}, start)
    assert first is not None and first["idle_stop_since"] is None
    for t in range(10, 60, 10):
        assert sampler.take(driver, {10}, start + t)["idle_stop_since"] is None  # type: ignore[index]
    due = sampler.take(driver, {10}, start + 60)
    assert due is not None and due["idle_stop_since"] is not None and due["idle_since"] is None  # not warned yet
    assert abs(datetime.fromisoformat(due["idle_stop_since"]) - datetime.now(UTC)) < timedelta(seconds=5)
    driver.busy = 50.0
    assert sampler.take(driver, {10}, start + 70)["idle_stop_since"] is None  # type: ignore[index]
    driver.busy = 0.0
    for t in range(80, 140, 10):
        sampler.take(driver, {10}, start + t)
    again = sampler.take(driver, {10}, start + 140)
    assert again is not None and again["idle_stop_since"] is not None  # the new stretch: 60 s from 80


def test_on_a_shared_gpu_its_busy_share_is_its_own_processes_part_by_nvmls_per_process_samples() -> None:
    shared = gpu(0, 80, [(10, 1000), (11, 500), (20, 9000)])  # its 10 and 11 beside a neighbour's 20
    shared.process_busy = {10: 90, 11: 30, 20: 360}  # summed over the window's samples: it ran a quarter
    assert shared.busy_of({10, 11}) == 20.0 and shared.busy_of({20}) == 60.0
    shared.process_busy = {20: 400}  # no kernel of its own in the window
    assert shared.busy_of({10, 11}) == 0.0
    # what cannot be split is the GPU's: per-process samples not kept, or no kernel in them
    for kept in (None, {}, {20: 0}):
        shared.process_busy = kept
        assert shared.busy_of({10, 11}) == 80, kept
    alone = gpu(1, 70, [(10, 1000)])
    alone.process_busy = {}  # its own GPU: what the GPU does, it does
    assert alone.busy_of({10}) == 70 and gpu(2, None, [(10, 5)]).busy_of({10}) is None

    said: list[str] = []
    sampler = GpuUseSampler(rank=0, indices=[0], every_s=10, idle_warn_s=20, warn=said.append)
    busy_neighbour = gpu(0, 100, [(10, 1000), (20, 9000)])
    busy_neighbour.process_busy = {20: 500}
    for t in range(0, 30, 10):  # its neighbour keeps the GPU busy; it is idle, and told so
        assert sampler.take(Fixed([busy_neighbour]), {10}, sampler.next_at + t) is not None
    assert sampler.figures().busy_pct == 0 and len(said) == 1, (sampler.figures(), said)


def test_nvmls_per_process_samples_are_read_over_the_window_and_kept_to_real_figures() -> None:
    now_us = int(time.time() * 1_000_000)
    samples = [
        SimpleNamespace(pid=10, timeStamp=now_us - 1_000_000, smUtil=40),
        SimpleNamespace(pid=10, timeStamp=now_us - 500_000, smUtil=60),
        SimpleNamespace(pid=20, timeStamp=now_us - 2_000_000, smUtil=100),
        SimpleNamespace(pid=30, timeStamp=now_us - 60_000_000, smUtil=100),  # before the window
        SimpleNamespace(pid=40, timeStamp=now_us, smUtil=2**32 - 1),  # not a figure
    ]
    driver = FakeDriver(samples)
    assert NvmlInventory(driver)._process_busy(0, []) == {10: 100, 20: 100}
    assert 0 <= driver.asked_since_us / 1e6 - (now_us / 1e6 - PROCESS_BUSY_WINDOW_S) < 1  # the window it asked for
    assert NvmlInventory(FakeDriver(FakeDriver.NVMLError(FakeDriver.NVML_ERROR_NOT_FOUND)))._process_busy(0, []) == {}
    assert (
        NvmlInventory(FakeDriver(FakeDriver.NVMLError(FakeDriver.NVML_ERROR_NOT_SUPPORTED)))._process_busy(0, [])
        is None
    )
    assert NvmlInventory(SimpleNamespace(nvmlDeviceGetCount=lambda: 0, NVMLError=OSError))._process_busy(0, []) is None


def test_a_notebook_on_a_shared_gpu_is_in_use_only_by_its_own_processes_part() -> None:
    shared = gpu(0, 90, [(10, 1000), (20, 9000)])
    shared.process_busy = {20: 900}  # its neighbour keeps the GPU busy; its kernel is idle
    assert not gpus_in_use([shared], [0], 0.5, {10})
    shared.process_busy = {10: 100, 20: 800}  # its part: 10% of the GPU
    assert gpus_in_use([shared], [0], 0.5, {10})
    assert not gpus_in_use([shared], [0], 0.5, {30})  # none of its processes on it
    assert not gpus_in_use([shared], [1], 0.5, {10})  # not its GPU
    own = gpu(0, 90, [(20, 9000)])  # a GPU of its own: what the GPU does, it does
    assert gpus_in_use([own], [0], 1.0, {10}) and not gpus_in_use([gpu(0, 4, [])], [0], 1.0, {10})


def test_under_cuda_mps_the_gpu_is_not_split_by_its_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML counts every MPS client's kernels as its server's: where the server is on the GPU,
    a job's part is not read from per-process samples (the GPU's whole figure stands). The
    server is a root-owned program of its name (tests/security/test_forged_mps_server.py)."""
    if os.geteuid() != 0:
        pytest.skip("a root-owned program stands for the driver's MPS server: needs root")
    monkeypatch.setenv("FAKE_NVML_GPUS", "81559")
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML / "pynvml.py")
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    server = tmp_path / MPS_SERVER  # root's, as the driver's is
    shutil.copy(shutil.which("sleep") or "/bin/sleep", server)
    holds = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "FAKE_GPU_MB": "300"}
    client = subprocess.Popen(["sleep", "30"], env={**holds, "FAKE_GPU_BUSY": "40"})
    try:
        inventory = NvmlInventory(fake)
        alone = wait_for(lambda: inventory.refresh()[0], lambda gpu: gpu.process_busy)
        assert alone.process_busy == {client.pid: 40}, alone
        mps = subprocess.Popen([str(server), "30"], env={**holds, "FAKE_GPU_BUSY": "0"})
        try:
            shared = wait_for(lambda: inventory.refresh()[0], lambda gpu: len(gpu.processes) == 2)
            assert shared.process_busy is None and shared.busy_of({client.pid}) == 40, shared
        finally:
            mps.kill()
            mps.wait()
    finally:
        client.kill()
        client.wait()


def wait_for(read, done, timeout: float = 10.0):
    """`read()` once `done` says its answer is ready."""
    deadline = time.monotonic() + timeout
    while not done(answer := read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer


class FakeDriver:
    """Just enough of pynvml for the per-process samples: `answer` is its list or its error."""

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    def __init__(self, answer: list[SimpleNamespace] | Exception) -> None:
        self.answer = answer
        self.asked_since_us = 0

    def nvmlDeviceGetCount(self) -> int:
        return 0

    def nvmlDeviceGetProcessUtilization(self, handle: int, since_us: int) -> list[SimpleNamespace]:
        self.asked_since_us = since_us
        if isinstance(self.answer, Exception):
            raise self.answer
        return [s for s in self.answer if s.timeStamp > since_us]


class Fixed(Inventory):
    simulated = False

    def __init__(self, states: list[GpuState]) -> None:
        self.states = states

    def gpus(self) -> list[GpuState]:
        return self.states


def test_gpus_that_do_not_say_how_busy_they_are_give_no_figure() -> None:
    sampler = GpuUseSampler(rank=1, indices=[0, 1], every_s=10)
    assert not sampler.sample([gpu(0, 50, [(10, 100)]), gpu(1, None, [(10, 100)])], {10})
    assert not sampler.sample([gpu(0, 50, [(10, 100)])], {10})  # one of its GPUs not listed
    assert sampler.figures() is None
    simulated = SimulatedInventory("lab-a", 2)
    assert sampler.take(simulated, {10}, time.monotonic() + 60) is None
    busy_unknown = GpuUseSampler(rank=0, indices=[0], every_s=10)
    assert busy_unknown.sample([gpu(0, 0, [(10, None)])], {10})  # busy known, memory not said
    assert busy_unknown.figures() is not None and busy_unknown.figures().memory_peak_mb is None


def test_every_attempt_and_rank_is_summed_up_by_its_samples_and_gpus() -> None:
    stored = {
        "1.0": {"rank": 0, "gpus": 1, "samples": 10, "busy_pct": 20, "memory_peak_mb": 9000, "memory_total_mb": 81559},
        "2.0": {"rank": 0, "gpus": 2, "samples": 30, "busy_pct": 80, "memory_peak_mb": None, "memory_total_mb": 40960},
    }
    assert gpu_use_summary(stored) == {
        "busy_pct": 71.4,  # (10 x 20 + 60 x 80) / 70
        "memory_peak_mb": 9000,
        "memory_total_mb": 40960,
        "samples": 40,
        "idle_since": None,
    }
    assert gpu_use_summary(None) is None and gpu_use_summary({}) is None


def test_a_running_job_is_idle_where_every_rank_of_its_attempt_says_so_since_the_latest() -> None:
    part = {"gpus": 1, "samples": 4, "busy_pct": 1.0}
    stored = {
        "1.0": {**part, "rank": 0, "idle_since": None},
        "2.0": {**part, "rank": 0, "idle_since": "2026-12-06T08:00:00Z"},
        "2.1": {**part, "rank": 1, "idle_since": "2026-12-06T08:05:30.250000Z"},
    }
    assert gpu_use_summary(stored, running=2)["idle_since"] == "2026-12-06T08:05:30.250000Z"
    assert gpu_use_summary(stored, running=None)["idle_since"] is None  # not running
    busy_rank = {**stored, "2.1": {**stored["2.1"], "idle_since": None}}
    assert gpu_use_summary(busy_rank, running=2)["idle_since"] is None
    since = (datetime.now(UTC) - timedelta(minutes=35, seconds=10)).isoformat()
    assert idle_text({"idle_since": since}) == "its GPUs have been idle for 35m (busy under 5% at every sample)"
    assert idle_text({"idle_since": None}) is None and idle_text(None) is None


class Driver(Inventory):
    """NVML as a test says it: one GPU, as busy as `busy` says now."""

    simulated = False

    def __init__(self) -> None:
        self.busy = 0.0

    def gpus(self) -> list[GpuState]:
        return [gpu(0, self.busy, [(10, 500)])]


def test_gpus_idle_for_the_warning_time_are_said_once_for_each_idle_stretch() -> None:
    said: list[str] = []
    driver = Driver()
    sampler = GpuUseSampler(rank=0, indices=[0], every_s=10, idle_warn_s=60, warn=said.append)
    start = sampler.next_at = float(int(sampler.next_at))  # whole seconds: start + 60 - start is 60 exactly
    for t in range(0, 70, 10):  # idle from the first sample on: told at 60 s, once
        assert sampler.take(driver, {10}, start + t) is not None
    assert said == [
        "its GPUs have been idle for 1m (busy under 5% at every sample): a program waiting on its input, or done "
        "with its GPUs, holds them from the lab"
    ]
    idle = sampler.figures()
    assert idle is not None and idle.idle_since is not None  # said in its figures once it was told
    driver.busy = 4.9  # still idle: nothing more
    sampler.take(driver, {10}, start + 70)
    driver.busy = 80.0  # busy again, then idle again: told again after another minute
    sampler.take(driver, {10}, start + 80)
    assert sampler.figures().idle_since is None
    driver.busy = 0.0
    for t in range(90, 150, 10):
        sampler.take(driver, {10}, start + t)
    assert len(said) == 1
    sampler.take(driver, {10}, start + 150)
    assert len(said) == 2 and said[1].startswith("its GPUs have been idle for 1m ")
    quiet = GpuUseSampler(rank=0, indices=[0], every_s=10, idle_warn_s=0, warn=said.append)  # 0: never
    for t in range(0, 600, 10):
        quiet.take(driver, {10}, quiet.next_at + t)
    assert len(said) == 2
