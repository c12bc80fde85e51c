"""When a job could start, during one scheduling pass: when each GPU of a host is ready for a
fraction (from the running jobs' ends) and where a job of a shape starts soonest.

`Outlook` reads its pass's `FreeGpus` (free fractions, holds, jobs per host, the GPUs lab
reservations keep) and keeps its answers per host until that host's GPUs, holds or jobs
change (`forget`, which `FreeGpus` calls on each change); `earliest`'s and `likeliest`'s
answers until anything changes (`changed`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from service.scheduler.types import EPSILON, INFINITY, QueuedJob, RunningJob

if TYPE_CHECKING:
    from service.scheduler.capacity import FreeGpus

MIN_EXPECTED_S = 60.0
Slots = list[tuple[str, tuple[int, ...]]]
Ready = list[tuple[float, float]]
"""Per GPU of a host: when it is ready, as (for sure, from time limits; expected); or, from
`likely_times`, as (most likely; for sure)."""
Soonest = tuple[tuple[float, float, str], Slots]


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


class Outlook:
    """When jobs could start on a pass's `FreeGpus`, with its caches."""

    def __init__(self, free: FreeGpus) -> None:
        self.free = free
        self._earliest: dict[tuple[object, ...], tuple[float, float, Slots] | None] = {}
        self._ready: dict[str, dict[tuple[float, bool], Ready]] = defaultdict(dict)
        """`ready_times` by host, until that host's GPUs, holds or jobs change (`forget`)."""
        self._likely: dict[str, dict[float, Ready]] = defaultdict(dict)
        """`likely_times` by host, as `_ready`."""
        self._soonest: dict[str, dict[tuple[object, ...], Soonest | None]] = defaultdict(dict)
        """`_soonest_on` by host, as `_ready`."""

    def changed(self) -> None:
        """Some host's GPUs, holds or jobs changed: `earliest`'s answers go."""
        self._earliest.clear()

    def forget(self, host: str) -> None:
        """`host`'s GPUs, holds or jobs change: what was kept of it goes."""
        self._ready.pop(host, None)
        self._likely.pop(host, None)
        self._soonest.pop(host, None)

    def ready_times(self, host: str, fraction: float, now: float, skip_held: bool = False) -> Ready:
        """For each GPU of `host`: when `fraction` of it is free, as (known, expected);
        never, for a GPU held for another job when `skip_held`. Kept until the host's GPUs
        are taken, given or held, or its jobs change."""
        ready = self._ready[host]
        key = (fraction, skip_held)
        if key not in ready:
            ready[key] = self._ready_times(host, fraction, now, skip_held)
        return ready[key]

    def _ready_times(self, host: str, fraction: float, now: float, skip_held: bool) -> Ready:
        return self._times(host, fraction, now, skip_held, expected_end)

    def likely_times(self, host: str, fraction: float, now: float) -> Ready:
        """For each GPU of `host`: when `fraction` of it is most likely free, the running jobs
        ending as the forecast takes them (`likely_end`), and when for sure; as `ready_times`."""
        likely = self._likely[host]
        if fraction not in likely:
            likely[fraction] = [
                (soonest, known) for known, soonest in self._times(host, fraction, now, False, likely_end)
            ]
        return likely[fraction]

    def _times(
        self, host: str, fraction: float, now: float, skip_held: bool, end: Callable[[RunningJob, float], float]
    ) -> Ready:
        """For each GPU of `host`: when `fraction` of it is free for sure (time limits) and as
        its running jobs end by `end`, taking them soonest `end` first."""
        times = []
        for now_free, holders in self._holders(host, skip_held):
            level, known, ends = now_free, now, now
            for running in sorted(holders, key=lambda r: end(r, now)):
                if level >= fraction - EPSILON:
                    break
                level += running.fraction
                known, ends = max(known, running.end), max(ends, end(running, now))
            times.append((known, ends) if level >= fraction - EPSILON else (INFINITY, INFINITY))
        return times

    def _holders(self, host: str, skip_held: bool) -> list[tuple[float, list[RunningJob]]]:
        """Per GPU of `host`: its free fraction and the running jobs on it; (-1, none) for a
        GPU unusable (or held for another job, with `skip_held`): it never frees up."""
        unusable = set(self.free.hosts[host].unusable)
        if skip_held:
            unusable |= set(self.free.holds.get(host, {}))
        on: dict[int, list[RunningJob]] = defaultdict(list)
        for running in self.free.running_on[host]:
            for i in running.indices:
                on[i].append(running)
        return [(-1.0, []) if i in unusable else (free, on[i]) for i, free in enumerate(self.free.free[host])]

    def earliest(self, job: QueuedJob, now: float, skip_held: bool = False) -> tuple[float, float, Slots] | None:
        """Where `job` can start soonest: (known start, expected start, GPUs). The known
        start comes from time limits only (inf when unknown); the host is chosen by it,
        then by the expected start. With `skip_held`, GPUs held for others are left out
        (a new reservation never overlaps another)."""
        kept = self.free.kept
        shape = (job.gpu_count, job.fraction, job.host, job.hosts, job.indices, skip_held, job.group if kept else None)
        if shape not in self._earliest:
            self._earliest[shape] = self._find_earliest(job, now, skip_held)
        return self._earliest[shape]

    def likeliest(self, job: QueuedJob, now: float) -> tuple[float, Slots] | None:
        """Where `job` most likely starts soonest, the running jobs ending as the forecast takes
        them (`likely_times`), and when, the waiting jobs aside: what its reason names, so that
        it names the jobs its expected start waits for (`earliest` goes by time limits)."""
        kept = self.free.kept
        shape = (job.gpu_count, job.fraction, job.host, job.hosts, job.indices, "likely", job.group if kept else None)
        if shape not in self._earliest:
            self._earliest[shape] = self._find_earliest(job, now, False, likely=True)
        found = self._earliest[shape]
        return (found[0], found[2]) if found else None

    def _find_earliest(
        self, job: QueuedJob, now: float, skip_held: bool, likely: bool = False
    ) -> tuple[float, float, Slots] | None:
        """`earliest`'s answer; with `likely`, by `likely_times`: (likely start, known, GPUs)."""
        free = self.free
        if job.gpu_count > free.largest:
            return self._earliest_whole_hosts(job, now, skip_held, likely)
        hosts = job.where(free.order)
        best: Soonest | None = None
        shape = (job.gpu_count, job.fraction, job.indices, skip_held, likely, job.group if free.kept else None)
        for host in hosts:
            if host not in free.free or free.hosts[host].size < job.gpu_count:
                continue
            cached = self._soonest[host]
            if shape not in cached:
                cached[shape] = self._soonest_on(host, job, now, skip_held, likely)
            found = cached[shape]
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        return (best[0][0], best[0][1], best[1]) if best else None

    def _ready_for(self, host: str, fraction: float, now: float, skip_held: bool, likely: bool) -> Ready:
        return self.likely_times(host, fraction, now) if likely else self.ready_times(host, fraction, now, skip_held)

    def _soonest_on(self, host: str, job: QueuedJob, now: float, skip_held: bool, likely: bool) -> Soonest | None:
        """When `job` could start on `host` soonest, as (known, expected, host), and on which
        of its GPUs; None when never. With `likely`, as (likely, known, host)."""
        times = self._after_kept(host, self._ready_for(host, job.fraction, now, skip_held, likely), job.group)
        wanted = job.indices if job.indices is not None else range(len(times))
        ranked = sorted(wanted, key=lambda i: (times[i], i))[: job.gpu_count]
        if len(ranked) < job.gpu_count:
            return None
        key = (max(times[i][0] for i in ranked), max(times[i][1] for i in ranked), host)
        return key, [(host, tuple(sorted(ranked)))]

    def _earliest_whole_hosts(
        self, job: QueuedJob, now: float, skip_held: bool, likely: bool
    ) -> tuple[float, float, Slots] | None:
        largest = self.free.largest
        needed = -(-job.gpu_count // max(largest, 1))
        ranked = []
        for host in self.free.order:
            if len(self.free.free[host]) == largest:
                times = self._after_kept(host, self._ready_for(host, 1.0, now, skip_held, likely), job.group)
                ranked.append((max(t[0] for t in times), max(t[1] for t in times), host))
        if len(ranked) < needed:
            return None
        chosen = sorted(ranked)[:needed]
        known = max(t for t, _, _ in chosen)
        expected = max(t for _, t, _ in chosen)
        return known, expected, [(host, tuple(range(largest))) for _, _, host in chosen]

    def _after_kept(self, host: str, times: Ready, group: str | None) -> Ready:
        """`times`, with each GPU kept for another group ready no sooner than its window's
        end (a borrower must end before the window, which these estimates cannot promise)."""
        kept = self.free.kept
        if not kept:
            return times
        adjusted = list(times)
        for i, (known, expected) in enumerate(times):
            for reservation in kept.get((host, i), ()):
                if reservation.group != group:
                    adjusted[i] = (max(known, reservation.end), max(expected, reservation.end))
        return adjusted
