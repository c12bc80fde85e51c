"""How busy an attempt keeps its GPUs, and the most GPU memory it holds, as `seff` says of
a Slurm job: a member sees whether a job used what it held (a notebook left idle on a GPU,
a data loader that starves the GPUs), and an admin sees it for every job.

Every `TOWERQ_GPU_USE_SAMPLE_S` the attempt's runner reads its GPUs from the driver (NVML):
their utilization (the share of the last sample period in which a kernel ran), and the
memory of each of its own processes (by host pid, as the memory cap reads them). On a GPU
shared with other processes its busy share is its own processes' part of the GPU's
utilization, as NVML's per-process samples split it (`GpuState.busy_of`). The mean
and the peak go to the job with the attempt's reports (`towerq.contract.attempts.GpuUse`,
kept per attempt and rank). Simulated GPUs say neither: a job on them has no figure.

A job whose GPUs stay idle (busy under `GPU_BUSY_PCT` at every sample) for
`TOWERQ_GPU_IDLE_WARN_S` is told so in its log, once for each such stretch: a program that
waits on its input, or is done with the GPUs, holds them from the lab. Where the lab sets
`TOWERQ_GPU_IDLE_STOP_S`, one that stays idle that long is stopped (it fails, saying why).
A notebook session has its own idle end (`worker.notebook`) and is neither."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from towerq.contract.attempts import GPU_BUSY_PCT, GpuUse, idle_stop_text
from towerq.contract.times import span_text
from worker.inventory import GpuState, Inventory


class GpuUseSampler:
    """What one rank's GPUs did so far this attempt; `sample` adds what the driver says now."""

    def __init__(
        self,
        rank: int,
        indices: list[int],
        every_s: float,
        idle_warn_s: float = 0.0,
        warn: Callable[[str], None] | None = None,
        idle_stop_s: float = 0.0,
        stop: Callable[[str], None] | None = None,
    ) -> None:
        """`warn` is told when its GPUs have been idle `idle_warn_s`, `stop` (why) when they
        have been idle `idle_stop_s` (0: never). Without `stop` (a rank of a job over several
        hosts) its figures say so, and towerq stops the job once every rank's do
        (`service.core.attempts.attempt_status`)."""
        self.rank = rank
        self.indices = set(indices)
        self.every_s = every_s
        self.idle_warn_s = idle_warn_s
        self.warn = warn
        self.idle_stop_s = idle_stop_s
        self.stop = stop
        self.idle_since: float | None = None
        """Since when every sample found its GPUs idle (None: the last one found them busy)."""
        self.idle_at: datetime | None = None
        """The same on the wall clock, as the job's figures say it once `idle_said`."""
        self.idle_said = False
        self.idle_stop_due = False
        """Idle `idle_stop_s` this stretch: said in its figures (`idle_stop_since`), and `stop` told."""
        self.last_busy = 0.0
        self.next_at = time.monotonic() + every_s
        """The first sample comes a period after the start (`started`): its process is
        starting before."""
        self.samples = 0
        self.busy_sum = 0.0
        """The sum over samples of the mean utilization of its GPUs."""
        self.memory_peak_mb: int | None = None
        self.memory_total_mb: int | None = None

    def started(self, now: float) -> None:
        """Its process started now (after the wait for the GPUs' last holders, the other
        ranks, its folder): the first sample a period on."""
        self.next_at = now + self.every_s

    def take(self, inventory: Inventory, pids: set[int], now: float) -> dict[str, Any] | None:
        """A sample when one is due (never of simulated GPUs): the figures to report, or None."""
        if inventory.simulated or now < self.next_at:
            return None
        self.next_at = now + self.every_s
        if not self.sample(inventory.refresh(), pids):
            return None
        self._watch_idle(now)
        figures = self.figures()
        return figures.model_dump(mode="json") if figures is not None else None

    def sample(self, gpus: list[GpuState], pids: set[int]) -> bool:
        """Take one sample of its GPUs among `gpus`, its processes being `pids`; False when
        the driver said nothing of how busy they are (simulated GPUs, an old driver)."""
        mine = [gpu for gpu in gpus if gpu.index in self.indices]
        busy = [share for gpu in mine if (share := gpu.busy_of(pids)) is not None]
        if len(mine) < len(self.indices) or len(busy) < len(mine):
            return False  # one of them is not listed (fallen off the bus) or does not say
        self.samples += 1
        self.last_busy = sum(busy) / len(busy)
        self.busy_sum += self.last_busy
        for gpu in mine:
            held = [p["used_mb"] for p in gpu.processes if p["pid"] in pids and p["used_mb"] is not None]
            if held:
                self.memory_peak_mb = max(self.memory_peak_mb or 0, sum(held))
        self.memory_total_mb = min(gpu.memory_total_mb for gpu in mine)
        return True

    def _watch_idle(self, now: float) -> None:
        """Tell `warn` once its GPUs have been idle `idle_warn_s`, once for each idle stretch;
        `stop` once they have been idle `idle_stop_s`, once for each idle stretch."""
        if self.last_busy >= GPU_BUSY_PCT:
            self.idle_since, self.idle_at, self.idle_said, self.idle_stop_due = None, None, False, False
            return
        if self.idle_since is None:
            self.idle_since, self.idle_at = now, datetime.now(UTC)
        idle_s = now - self.idle_since
        if self.warn is not None and self.idle_warn_s and not self.idle_said and idle_s >= self.idle_warn_s:
            self.idle_said = True
            self.warn(
                f"its GPUs have been idle for {span_text(idle_s)} (busy under {GPU_BUSY_PCT:g}% at every "
                "sample): a program waiting on its input, or done with its GPUs, holds them from the lab"
            )
        if self.idle_stop_s and not self.idle_stop_due and idle_s >= self.idle_stop_s:
            self.idle_stop_due = True
            if self.stop is not None:
                self.stop(idle_stop_text(idle_s, self.idle_stop_s))

    def figures(self) -> GpuUse | None:
        """What to report (None before the first sample)."""
        if not self.samples:
            return None
        return GpuUse(
            rank=self.rank,
            gpus=len(self.indices),
            samples=self.samples,
            busy_pct=round(min(100.0, max(0.0, self.busy_sum / self.samples)), 2),
            memory_peak_mb=self.memory_peak_mb,
            memory_total_mb=self.memory_total_mb,
            idle_since=self.idle_at if self.idle_said else None,
            idle_stop_since=self.idle_at if self.idle_stop_due else None,
        )


def gpus_in_use(gpus: list[GpuState], indices: list[int], fraction: float, pids: set[int]) -> bool:
    """Whether one of its GPUs (`indices` among `gpus`) is in use (busy `GPU_BUSY_PCT` or
    more): a GPU of its own (`fraction` 1) whatever runs there; a shared one only by its own
    processes (`pids`), their part of the GPU's use."""
    for gpu in gpus:
        if gpu.index not in indices:
            continue
        if fraction >= 1:
            busy = gpu.utilization_pct  # its own GPU: what the GPU does, it does
        elif any(p["pid"] in pids for p in gpu.processes):
            busy = gpu.busy_of(pids)
        else:
            continue
        if (busy or 0) >= GPU_BUSY_PCT:
            return True
    return False
