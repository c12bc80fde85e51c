"""A job's GPU use (`worker.gpu_use`, `Job.gpu_use_summary`): the mean busy share over its
samples and GPUs, the most its own processes held on one GPU (a neighbour's processes on a
shared GPU are not its own), nothing from GPUs that do not say how busy they are, and every
attempt's and rank's figures summed up weighted by their samples and GPUs."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from service.core.models.jobs import gpu_use_summary, idle_text
from worker.gpu_use import GpuUseSampler
from worker.inventory import GpuState, Inventory, SimulatedInventory


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
    start = sampler.next_at
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
