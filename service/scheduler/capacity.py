"""Free GPU capacity during one scheduling pass: where a job fits now (when it could:
`outlook.Outlook`, which each `FreeGpus` keeps).

`FreeGpus` is a copy of the cluster's free fractions that a pass consumes as it places
jobs, plus the GPUs it holds for jobs that must not wait forever (reservations, and room
being made by preemption), and the GPUs an admin kept for a group over a window (a lab
reservation: `LabReservation`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from service.scheduler.outlook import Outlook, Slots
from service.scheduler.types import (
    EPSILON,
    INFINITY,
    Cluster,
    HostCapacity,
    LabReservation,
    QueuedJob,
    RunningJob,
)

Ends = tuple[float, float]
"""When a job ends: (for sure, from its time limit; likely, from its owner's history)."""


def ends_if_started(job: QueuedJob, now: float) -> Ends:
    """When `job` would end if it started `now`: surely, from its time limit; likely, from
    its owner's recent run times (inf when unknown)."""
    known = now + job.limit_s if job.limit_s is not None else INFINITY
    likely = now + job.estimate_s if job.estimate_s is not None else known
    return known, likely


@dataclass(slots=True)
class Hold:
    """GPUs set aside for a waiting job from `start` on (inf: when is not known)."""

    job_id: int
    start: float
    expected: float = INFINITY
    """When the holder is expected to start, from the holders' likely ends."""


class FreeGpus:
    """Free fractions per host and GPU, with holds; the pass's working state."""

    def __init__(self, cluster: Cluster, now: float = -INFINITY, lend_likely: bool = False) -> None:
        self.now = now
        self.lend_likely = lend_likely
        """Lend GPUs kept for a group to jobs very likely (not surely) done before the
        window: with preemption on, one that is not is stopped when the window begins."""
        self.kept: dict[tuple[str, int], list[LabReservation]] = defaultdict(list)
        for kept in cluster.reservations:
            if kept.end > now:
                for gpu in kept.gpus:
                    self.kept[gpu].append(kept)
        self.ignore_kept = False
        """Set while explaining a wait: would the job fit but for the kept GPUs?"""
        self.hosts: dict[str, HostCapacity] = {h.name: h for h in cluster.hosts}
        self.free: dict[str, list[float]] = {h.name: list(h.free) for h in cluster.hosts}
        self.order = [h.name for h in cluster.hosts]
        self.largest = max((h.size for h in cluster.hosts), default=0)
        self.holds: dict[str, dict[int, Hold]] = defaultdict(dict)
        self._holding: set[tuple[int, str]] = set()
        """(job, host) for each host where GPUs are held for the job."""
        self.running_on: dict[str, list[RunningJob]] = defaultdict(list)
        for job in cluster.running:
            self.running_on[job.host].append(job)
        self.with_room = {name for name, free in self.free.items() if any(f > EPSILON for f in free)}
        self._full = {name: sum(1 for f in free if f >= 1 - EPSILON) for name, free in self.free.items()}
        self.max_full = max(self._full.values(), default=0)
        self.outlook = Outlook(self)
        """When jobs could start, kept per host until what is on it changes."""
        self.version = 0
        """Raised whenever capacity or holds change, so answers cached on it go stale."""
        for job_id, host, indices in cluster.held:
            if host in self.free:
                self.hold(job_id, [(host, indices)], now, now)

    @property
    def any_free(self) -> bool:
        return bool(self.with_room)

    # -- what fits now --------------------------------------------------------------------

    def usable(self, host: str, index: int, job: QueuedJob, end: Ends) -> bool:
        """Whether `job` may take its fraction of this GPU now."""
        if self.free[host][index] < job.fraction - EPSILON:
            return False
        if self.kept and not self.ignore_kept and (host, index) in self.kept:
            if any(not self.may_borrow(kept, job, end) for kept in self.kept[(host, index)]):
                return False
        hold = self.holds[host].get(index) if self.holds else None
        if hold is None or hold.job_id == job.id:
            return True
        # A held GPU goes to a job known to end before the holder starts (EASY backfill),
        # or very likely to: its owner's recent run times say so, and the holder is not
        # expected to be ready before then anyway.
        known, likely = end
        return (known < INFINITY and known <= hold.start) or (likely < INFINITY and likely <= hold.expected)

    def may_borrow(self, kept: LabReservation, job: QueuedJob, end: Ends) -> bool:
        """Whether `job` may take a GPU of `kept` now: one of its group's always; another
        only before the window, and only if it ends by the window's start (surely, from its
        time limit; or very likely, when `lend_likely`)."""
        if job.group == kept.group:
            return True
        if self.now >= kept.start:
            return False
        known, likely = end
        return known <= kept.start or (self.lend_likely and likely <= kept.start)

    def _kept_from_job(self, host: str, job: QueuedJob) -> set[int]:
        """The GPUs of `host` that reservations keep from `job` now."""
        if not self.kept:
            return set()
        end = ends_if_started(job, self.now)
        return {
            i
            for (name, i), reservations in self.kept.items()
            if name == host and any(not self.may_borrow(kept, job, end) for kept in reservations)
        }

    def kept_from(self, host: str, indices: tuple[int, ...], group: str | None) -> LabReservation | None:
        """The first reservation of another group that keeps one of these GPUs."""
        for i in indices:
            for kept in self.kept.get((host, i), ()):
                if kept.group != group:
                    return kept
        return None

    def open_to(self, host: str, index: int, job: QueuedJob | None) -> bool:
        """Whether this GPU, once free, is `job`'s to take: not held for another job, not
        kept from it by a reservation (`job` None: not held or kept at all)."""
        hold = self.holds[host].get(index) if self.holds else None
        if hold is not None and (job is None or hold.job_id != job.id):
            return False
        if (host, index) not in self.kept:
            return True
        return job is not None and index not in self._kept_from_job(host, job)

    def fit_on_host(self, host: str, job: QueuedJob, end: Ends) -> tuple[int, ...] | None:
        """The GPUs `job` would get on `host` now (the fullest usable ones), or None."""
        free = self.free[host]
        if job.indices is not None:
            ok = all(i < len(free) and self.usable(host, i, job, end) for i in job.indices)
            return job.indices if ok else None
        candidates = [i for i in range(len(free)) if self.usable(host, i, job, end)]
        if len(candidates) < job.gpu_count:
            return None
        candidates.sort(key=lambda i: (free[i], i))
        return tuple(sorted(candidates[: job.gpu_count]))

    def fit(self, job: QueuedJob, end: Ends) -> Slots | None:
        """Where `job` fits now: the tightest host that holds it (best fit keeps whole hosts
        free for big jobs), or whole hosts for a job larger than any host (trace replay)."""
        if job.gpu_count > self.largest:
            return self._fit_whole_hosts(job, end)
        if job.fraction >= 1 - EPSILON and job.gpu_count > self.max_full:
            return None
        hosts = job.where(self.order)
        best: tuple[float, str, tuple[int, ...]] | None = None
        for host in hosts:
            if host not in self.with_room:
                continue
            indices = self.fit_on_host(host, job, end)
            if indices is None:
                continue
            spare = sum(self.free[host]) - job.gpu_count * job.fraction
            if best is None or spare < best[0]:
                best = (spare, host, indices)
        return [(best[1], best[2])] if best else None

    def _fit_whole_hosts(self, job: QueuedJob, end: Ends) -> Slots | None:
        needed = -(-job.gpu_count // max(self.largest, 1))
        whole = []
        for host in self.order:
            size = len(self.free[host])
            if size == self.largest and all(self.usable(host, i, job, end) for i in range(size)):
                whole.append((host, tuple(range(size))))
                if len(whole) == needed:
                    return whole
        return None

    def take(self, slots: Slots, fraction: float) -> None:
        self.outlook.changed()
        self.version += 1
        for host, indices in slots:
            self.outlook.forget(host)
            free = self.free[host]
            for i in indices:
                if free[i] >= 1 - EPSILON and free[i] - fraction < 1 - EPSILON:
                    self._full[host] -= 1
                free[i] = max(0.0, free[i] - fraction)
            if not any(f > EPSILON for f in free):
                self.with_room.discard(host)
        self.max_full = max(self._full.values(), default=0)

    def give(self, host: str, indices: tuple[int, ...], fraction: float) -> None:
        """`fraction` of these GPUs of `host` is free again in this pass (an elastic job
        shrinks); a GPU that takes no new work stays at 0."""
        self.outlook.changed()
        self.outlook.forget(host)
        self.version += 1
        free, unusable = self.free[host], self.hosts[host].unusable
        for i in indices:
            if i >= len(free) or i in unusable:
                continue
            was_full = free[i] >= 1 - EPSILON
            free[i] = min(1.0, free[i] + fraction)
            if not was_full and free[i] >= 1 - EPSILON:
                self._full[host] += 1
        if any(f > EPSILON for f in free):
            self.with_room.add(host)
        self.max_full = max(self._full.values(), default=0)

    def runs_on(self, running: RunningJob, indices: tuple[int, ...], host: str | None = None) -> None:
        """From now in this pass `running` holds `indices` of its host, or of `host` (an
        elastic job's resize): its entry is replaced, the cluster's own is left as it is."""
        jobs = self.running_on[running.host]
        jobs.pop(next(k for k, job in enumerate(jobs) if job is running))
        moved = host or running.host
        self.running_on[moved].append(replace(running, host=moved, indices=indices))
        self.outlook.forget(running.host)
        self.outlook.forget(moved)
        self.outlook.changed()

    def hold(self, job_id: int, slots: Slots, start: float, expected: float) -> None:
        self.outlook.changed()
        self.version += 1
        for host, indices in slots:
            self.outlook.forget(host)
            for i in indices:
                self.holds[host][i] = Hold(job_id, start, expected)
            self._holding.add((job_id, host))

    def would_fit_if_freed(self, job: QueuedJob, host: str, freed: list[RunningJob]) -> tuple[int, ...] | None:
        """The GPUs `job` would get on `host` if the `freed` jobs' GPUs were free (not those
        held for another job: a GPU freed for one high-priority job is not freed twice)."""
        if not freed and host not in self.with_room and job.fraction > 2 * EPSILON:
            return None  # no GPU with room, none freed
        holds = self.holds.get(host)
        if holds and len(self.free[host]) - len(holds) < job.gpu_count and (job.id, host) not in self._holding:
            return None  # too few GPUs not held for others
        free = list(self.free[host])
        unusable = self.hosts[host].unusable
        if freed:
            after = HostCapacity(host, free, unusable)  # gives onto the copy `free`
            for running in freed:
                after.give(running.indices, running.fraction)
        if holds:
            unusable = unusable | {i for i, hold in holds.items() if hold.job_id != job.id}
        if self.kept:
            unusable = unusable | self._kept_from_job(host, job)
        wanted = job.indices if job.indices is not None else range(len(free))
        fitting = [i for i in wanted if i not in unusable and free[i] >= job.fraction - EPSILON]
        if job.indices is not None:
            return job.indices if len(fitting) == len(job.indices) else None
        return tuple(fitting[: job.gpu_count]) if len(fitting) >= job.gpu_count else None
