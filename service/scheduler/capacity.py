"""Free GPU capacity during one scheduling pass: where a job fits now, and when it could.

`FreeGpus` is a copy of the cluster's free fractions that a pass consumes as it places
jobs, plus the GPUs it holds for jobs that must not wait forever (reservations, and room
being made by preemption), and the GPUs an admin kept for a group over a window (a lab
reservation: `LabReservation`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from service.scheduler.types import (
    EPSILON,
    INFINITY,
    Cluster,
    HostCapacity,
    LabReservation,
    QueuedJob,
    RunningJob,
)

MIN_EXPECTED_S = 60.0
Slots = list[tuple[str, tuple[int, ...]]]
Ends = tuple[float, float]
"""When a job ends: (for sure, from its time limit; likely, from its owner's history)."""


def ends_if_started(job: QueuedJob, now: float) -> Ends:
    """When `job` would end if it started `now`: surely, from its time limit; likely, from
    its owner's recent run times (inf when unknown)."""
    known = now + job.limit_s if job.limit_s is not None else INFINITY
    likely = now + job.estimate_s if job.estimate_s is not None else known
    return known, likely


def expected_end(running: RunningJob, now: float) -> float:
    """When a running job will likely end: its time limit; else its owner's usual run time;
    else, or once it has outlived that, after as long again as it has run so far."""
    if running.limit_s is not None:
        return running.end
    if running.estimate_s is not None and running.started + running.estimate_s > now:
        return running.started + running.estimate_s
    return _as_long_again(running, now)


def likely_end(running: RunningJob, now: float) -> float:
    """When a running job will most likely end, for expected starts (`expected_end` is
    cautious, a 90th percentile, as lending held GPUs must be): when its pace is measured,
    its own ETA (the end its page shows, so the job waiting for it says the same); else its
    owner's median run time, or once it has outlived that, as long again as it has run so
    far; never past its time limit. With neither known, `expected_end`."""
    if running.measured_end is not None:
        return min(max(running.measured_end, now), running.end)
    if running.typical_s is None:
        return expected_end(running, now)
    typical = running.started + running.typical_s
    return min(typical if typical > now else _as_long_again(running, now), running.end)


def _as_long_again(running: RunningJob, now: float) -> float:
    """A job that has outlived what was known of it ends after as long again as it has run
    (with heavy-tailed run times, the longer a job has run, the longer it is likely to go on)."""
    return now + max(now - running.started, MIN_EXPECTED_S)


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
        self._earliest: dict[tuple[object, ...], tuple[float, float, Slots] | None] = {}
        self._ready: dict[str, dict[tuple[float, bool], list[tuple[float, float]]]] = defaultdict(dict)
        """`ready_times` by host, until that host's GPUs, holds or jobs change (`_forget`)."""
        self._soonest: dict[str, dict[tuple[object, ...], tuple[tuple[float, float, str], Slots] | None]] = defaultdict(
            dict
        )
        """`_soonest_on` by host, as `_ready`."""
        self.version = 0
        """Raised whenever capacity or holds change, so answers cached on it go stale."""

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
        hosts = [job.host] if job.host is not None else self.order
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
        self._earliest.clear()
        self.version += 1
        for host, indices in slots:
            self._forget(host)
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
        self._earliest.clear()
        self._forget(host)
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
        self._forget(running.host)
        self._forget(moved)
        self._earliest.clear()

    # -- when it could fit ----------------------------------------------------------------

    def _forget(self, host: str) -> None:
        """`host`'s GPUs, holds or jobs change: what was cached of it goes."""
        self._ready.pop(host, None)
        self._soonest.pop(host, None)

    def ready_times(self, host: str, fraction: float, now: float, skip_held: bool = False) -> list[tuple[float, float]]:
        """For each GPU of `host`: when `fraction` of it is free, as (known, expected);
        never, for a GPU held for another job when `skip_held`. Cached until the host's
        GPUs are taken, given or held, or its jobs change."""
        ready = self._ready[host]
        key = (fraction, skip_held)
        if key not in ready:
            ready[key] = self._ready_times(host, fraction, now, skip_held)
        return ready[key]

    def _ready_times(self, host: str, fraction: float, now: float, skip_held: bool) -> list[tuple[float, float]]:
        free = self.free[host]
        unusable = set(self.hosts[host].unusable)
        if skip_held:
            unusable |= set(self.holds.get(host, {}))
        holders: dict[int, list[RunningJob]] = defaultdict(list)
        for running in self.running_on[host]:
            for i in running.indices:
                holders[i].append(running)
        times = []
        for i, now_free in enumerate(free):
            if i in unusable:
                times.append((INFINITY, INFINITY))
                continue
            level, known, expected = now_free, now, now
            for running in sorted(holders[i], key=lambda r: expected_end(r, now)):
                if level >= fraction - EPSILON:
                    break
                level += running.fraction
                known = max(known, running.end)
                expected = max(expected, expected_end(running, now))
            times.append((known, expected) if level >= fraction - EPSILON else (INFINITY, INFINITY))
        return times

    def earliest(self, job: QueuedJob, now: float, skip_held: bool = False) -> tuple[float, float, Slots] | None:
        """Where `job` can start soonest: (known start, expected start, GPUs). The known
        start comes from time limits only (inf when unknown); the host is chosen by it,
        then by the expected start. With `skip_held`, GPUs held for others are left out
        (a new reservation never overlaps another)."""
        shape = (job.gpu_count, job.fraction, job.host, job.indices, skip_held, job.group if self.kept else None)
        if shape not in self._earliest:
            self._earliest[shape] = self._find_earliest(job, now, skip_held)
        return self._earliest[shape]

    def _find_earliest(self, job: QueuedJob, now: float, skip_held: bool) -> tuple[float, float, Slots] | None:
        if job.gpu_count > self.largest:
            return self._earliest_whole_hosts(job, now, skip_held)
        hosts = [job.host] if job.host is not None else self.order
        best: tuple[tuple[float, float, str], Slots] | None = None
        shape = (job.gpu_count, job.fraction, job.indices, skip_held, job.group if self.kept else None)
        for host in hosts:
            if host not in self.free or self.hosts[host].size < job.gpu_count:
                continue
            cached = self._soonest[host]
            if shape not in cached:
                cached[shape] = self._soonest_on(host, job, now, skip_held)
            found = cached[shape]
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        return (best[0][0], best[0][1], best[1]) if best else None

    def _soonest_on(
        self, host: str, job: QueuedJob, now: float, skip_held: bool
    ) -> tuple[tuple[float, float, str], Slots] | None:
        """When `job` could start on `host` soonest, as (known, expected, host), and on which
        of its GPUs; None when never."""
        times = self._after_kept(host, self.ready_times(host, job.fraction, now, skip_held), job.group)
        wanted = job.indices if job.indices is not None else range(len(times))
        ranked = sorted(wanted, key=lambda i: (times[i], i))[: job.gpu_count]
        if len(ranked) < job.gpu_count:
            return None
        key = (max(times[i][0] for i in ranked), max(times[i][1] for i in ranked), host)
        return key, [(host, tuple(sorted(ranked)))]

    def _earliest_whole_hosts(self, job: QueuedJob, now: float, skip_held: bool) -> tuple[float, float, Slots] | None:
        needed = -(-job.gpu_count // max(self.largest, 1))
        ranked = []
        for host in self.order:
            if len(self.free[host]) == self.largest:
                times = self._after_kept(host, self.ready_times(host, 1.0, now, skip_held), job.group)
                ranked.append((max(t[0] for t in times), max(t[1] for t in times), host))
        if len(ranked) < needed:
            return None
        chosen = sorted(ranked)[:needed]
        known = max(t for t, _, _ in chosen)
        expected = max(t for _, t, _ in chosen)
        return known, expected, [(host, tuple(range(self.largest))) for _, _, host in chosen]

    def _after_kept(self, host: str, times: list[tuple[float, float]], group: str | None) -> list[tuple[float, float]]:
        """`times`, with each GPU kept for another group ready no sooner than its window's
        end (a borrower must end before the window, which these estimates cannot promise)."""
        if not self.kept:
            return times
        adjusted = list(times)
        for i, (known, expected) in enumerate(times):
            for kept in self.kept.get((host, i), ()):
                if kept.group != group:
                    adjusted[i] = (max(known, kept.end), max(expected, kept.end))
        return adjusted

    def hold(self, job_id: int, slots: Slots, start: float, expected: float) -> None:
        self._earliest.clear()
        self.version += 1
        for host, indices in slots:
            self._forget(host)
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
