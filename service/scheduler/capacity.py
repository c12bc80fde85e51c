"""Free GPU capacity during one scheduling pass: where a job fits now, and when it could.

`FreeGpus` is a mutable copy of the cluster's free fractions that a pass consumes as it
places jobs, plus the reservations it makes for jobs that must not starve.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from service.scheduler.types import EPSILON, INFINITY, Cluster, HostCapacity, QueuedJob, RunningJob


@dataclass(slots=True)
class Hold:
    """GPUs set aside for a waiting job from `start` on (inf: when is not known)."""

    job_id: int
    start: float


class FreeGpus:
    """Free fractions per host and GPU, with reservations; the pass's working state."""

    def __init__(self, cluster: Cluster) -> None:
        self.hosts: dict[str, HostCapacity] = {h.name: h for h in cluster.hosts}
        self.free: dict[str, list[float]] = {h.name: list(h.free) for h in cluster.hosts}
        self.order = [h.name for h in cluster.hosts]
        self.largest = max((h.size for h in cluster.hosts), default=0)
        self.holds: dict[str, dict[int, Hold]] = defaultdict(dict)
        self.running_on: dict[str, list[RunningJob]] = defaultdict(list)
        for job in cluster.running:
            self.running_on[job.host].append(job)
        self._full = {h.name: sum(1 for f in h.free if f >= 1 - EPSILON) for h in cluster.hosts}
        self.max_full = max(self._full.values(), default=0)
        self.any_free = any(f > EPSILON for fs in self.free.values() for f in fs)

    # -- what fits now --------------------------------------------------------------------

    def usable(self, host: str, index: int, job: QueuedJob, end: float) -> bool:
        """Whether `job` (ending at `end`) may take `fraction` of this GPU now."""
        if self.free[host][index] < job.fraction - EPSILON:
            return False
        hold = self.holds[host].get(index) if self.holds else None
        return hold is None or hold.job_id == job.id or end <= hold.start

    def fit_on_host(self, host: str, job: QueuedJob, end: float) -> tuple[int, ...] | None:
        """The GPUs `job` would get on `host` now (fullest usable ones first), or None."""
        free = self.free[host]
        if job.indices is not None:
            ok = all(i < len(free) and self.usable(host, i, job, end) for i in job.indices)
            return job.indices if ok else None
        candidates = [i for i in range(len(free)) if self.usable(host, i, job, end)]
        if len(candidates) < job.gpus:
            return None
        candidates.sort(key=lambda i: (free[i], i))
        return tuple(sorted(candidates[: job.gpus]))

    def fit(self, job: QueuedJob, end: float) -> list[tuple[str, tuple[int, ...]]] | None:
        """Where `job` fits now: the tightest host that holds it, or whole hosts for a job
        larger than any host (trace replay only)."""
        if job.gpus > self.largest:
            return self._fit_whole_hosts(job, end)
        if job.fraction >= 1 - EPSILON and job.gpus > self.max_full and job.host is None:
            return None
        hosts = [job.host] if job.host is not None else self.order
        best: tuple[float, str, tuple[int, ...]] | None = None
        for host in hosts:
            if host not in self.free:
                continue
            indices = self.fit_on_host(host, job, end)
            if indices is None:
                continue
            spare = sum(self.free[host]) - job.gpus * job.fraction
            if best is None or spare < best[0]:
                best = (spare, host, indices)
        return [(best[1], best[2])] if best else None

    def _fit_whole_hosts(self, job: QueuedJob, end: float) -> list[tuple[str, tuple[int, ...]]] | None:
        needed = -(-job.gpus // max(self.largest, 1))
        whole = []
        for host in self.order:
            size = len(self.free[host])
            if size == self.largest and all(self.usable(host, i, job, end) for i in range(size)):
                if all(self.free[host][i] >= 1 - EPSILON for i in range(size)):
                    whole.append((host, tuple(range(size))))
            if len(whole) == needed:
                return whole
        return None

    def take(self, slots: list[tuple[str, tuple[int, ...]]], fraction: float) -> None:
        for host, indices in slots:
            free = self.free[host]
            for i in indices:
                was_full = free[i] >= 1 - EPSILON
                free[i] = max(0.0, free[i] - fraction)
                if was_full and free[i] < 1 - EPSILON:
                    self._full[host] -= 1
        self.max_full = max(self._full.values(), default=0)
        self.any_free = any(f > EPSILON for fs in self.free.values() for f in fs)

    # -- when it could fit ----------------------------------------------------------------

    def gpu_ready_times(self, host: str, fraction: float, now: float) -> list[float]:
        """For each GPU of `host`: when `fraction` of it is free, as far as known."""
        free = self.free[host]
        unusable = self.hosts[host].unusable
        by_gpu: dict[int, list[RunningJob]] = defaultdict(list)
        for running in self.running_on[host]:
            for i in running.indices:
                by_gpu[i].append(running)
        times = []
        for i, now_free in enumerate(free):
            if i in unusable:
                times.append(INFINITY)
                continue
            level, ready = now_free, now
            for running in sorted(by_gpu[i], key=lambda r: r.end):
                if level >= fraction - EPSILON:
                    break
                level += running.fraction
                ready = max(now, running.end)
            times.append(ready if level >= fraction - EPSILON else INFINITY)
        return times

    def earliest(self, job: QueuedJob, now: float) -> tuple[float, list[tuple[str, tuple[int, ...]]]] | None:
        """The earliest known start of `job` and the GPUs it would get then.

        Among hosts where the start is unknown, the one with the most usable GPUs free now
        wins, so a host being drained for a job stays the chosen one pass after pass.
        """
        if job.gpus > self.largest:
            return self._earliest_whole_hosts(job, now)
        hosts = [job.host] if job.host is not None else self.order
        best: tuple[tuple[float, int], list[tuple[str, tuple[int, ...]]]] | None = None
        for host in hosts:
            if host not in self.free or self.hosts[host].size < job.gpus:
                continue
            times = self.gpu_ready_times(host, job.fraction, now)
            wanted = job.indices if job.indices is not None else range(len(times))
            ranked = sorted(wanted, key=lambda i: (times[i], -self.free[host][i], i))[: job.gpus]
            if len(ranked) < job.gpus:
                continue
            start = max(times[i] for i in ranked)
            ready_now = sum(1 for i in ranked if times[i] <= now)
            key = (start, -ready_now)
            if best is None or key < best[0]:
                best = (key, [(host, tuple(sorted(ranked)))])
        return (best[0][0], best[1]) if best else None

    def _earliest_whole_hosts(
        self, job: QueuedJob, now: float
    ) -> tuple[float, list[tuple[str, tuple[int, ...]]]] | None:
        needed = -(-job.gpus // max(self.largest, 1))
        ranked = []
        for host in self.order:
            if len(self.free[host]) != self.largest:
                continue
            times = self.gpu_ready_times(host, 1.0, now)
            free_now = sum(1 for t in times if t <= now)
            ranked.append((max(times), -free_now, host))
        ranked.sort()
        if len(ranked) < needed:
            return None
        chosen = ranked[:needed]
        start = max(t for t, _, _ in chosen)
        return start, [(host, tuple(range(self.largest))) for _, _, host in chosen]

    def hold(self, job_id: int, slots: list[tuple[str, tuple[int, ...]]], start: float) -> None:
        for host, indices in slots:
            for i in indices:
                self.holds[host][i] = Hold(job_id, start)
