"""One simulated cluster on a virtual clock, for the forecast and the trace simulator.

Both replay the policy forward: the forecast from the live state (when will each waiting job
start?), the simulator over a whole trace. What happens between two policy calls is the same
in both and is written here once: the free fraction of each GPU as jobs start and end, a
stopped job holding its GPUs `CHECKPOINT_S` more while it checkpoints, and the events ahead in
time order. An event is a job's end, the end of a stopped job's checkpoint, or a wake-up (a
moment the policy may decide differently, such as a time slice running out). A job's events
belong to one attempt: an end planned for an attempt that was stopped, or restarted since,
is dropped here, not by each caller.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from service.scheduler.costs import CHECKPOINT_S, sliceable_from
from service.scheduler.outlook import likely_end
from service.scheduler.types import (
    Cluster,
    Decision,
    HostCapacity,
    LabReservation,
    Placement,
    QueuedJob,
    RunningJob,
)


class Happens(enum.StrEnum):
    END = "end"
    """The job has run its course: its GPUs are free."""
    STOPPED = "stopped"
    """A stopped job has checkpointed: its GPUs are free, its work is not done."""
    WAKE = "wake"
    """Nothing changes, but the policy may now decide differently."""


@dataclass(frozen=True, slots=True, order=True)
class Event:
    time: float
    seq: int
    """Ties at one instant go in the order the events were planned."""
    happens: Happens
    job_id: int = -1
    attempt: int = 0


class SimCluster:
    """Hosts with free fractions per GPU, the jobs running on them (a job may have a part on
    each of several hosts) and the events ahead."""

    def __init__(self, hosts: list[HostCapacity], running: Iterable[RunningJob] = ()) -> None:
        """`hosts` already account for `running` (as the live snapshot's do)."""
        self.hosts = hosts
        self.by_name = {h.name: h for h in hosts}
        self.parts: dict[int, list[RunningJob]] = {}
        self._attempt: dict[int, int] = {}
        self._end: dict[int, float] = {}
        """When each running job's current attempt is planned to end."""
        self._events: list[Event] = []
        self._seq = 0
        self.reservations: list[LabReservation] = []
        for run in running:
            self.parts.setdefault(run.id, []).append(run)
            self._attempt[run.id] = 1

    @property
    def running(self) -> list[RunningJob]:
        return [part for parts in self.parts.values() for part in parts]

    def view(self) -> Cluster:
        """The cluster as the policy sees it (the hosts are shared, not copied)."""
        return Cluster(self.hosts, self.running, self.reservations)

    # -- what happens -----------------------------------------------------------------------

    def start(self, parts: list[RunningJob], run_s: float) -> None:
        """A job starts (a new attempt) on its `parts`, to end `run_s` after it started."""
        job_id = parts[0].id
        for part in parts:
            self.by_name[part.host].take(part.indices, part.fraction)
        self.parts[job_id] = parts
        self._attempt[job_id] = self._attempt.get(job_id, 0) + 1
        self.ends_at(job_id, parts[0].started + run_s)

    def ends_at(self, job_id: int, time: float) -> None:
        """The running job will end at `time` (its current attempt)."""
        self._end[job_id] = time
        self._plan(time, Happens.END, job_id)

    def end_of(self, job_id: int) -> float | None:
        """When the running job's current attempt is planned to end; None when it is not running."""
        return self._end.get(job_id) if job_id in self.parts else None

    def stop(self, job_id: int, now: float) -> bool:
        """Stop a running job: it checkpoints, holding its GPUs `CHECKPOINT_S` more. False
        when it is not running or already stopping."""
        parts = self.parts.get(job_id)
        if not parts or parts[0].stopping:
            return False
        for part in parts:
            part.stopping = True
        self._plan(now + CHECKPOINT_S, Happens.STOPPED, job_id)
        return True

    def apply(
        self,
        decision: Decision,
        now: float,
        resize: Callable[[int, str | None, tuple[int, ...]], None],
        start: Callable[[Placement], None],
    ) -> None:
        """A pass's decision, in the one order that gives no GPU twice: stops (they hold their
        GPUs while they checkpoint), shrinks (before the placements that take what they give
        up), grows and moves (a move frees GPUs for a placement; a growth takes only GPUs no
        placement takes, as the pass grows jobs last), then the placements. `resize(job, host,
        indices)`: an elastic job restarts on `indices` of its host, or of `host`."""
        for victim in [*decision.preempt, *decision.reclaim]:
            self.stop(victim, now)
        for job_id, kept in decision.shrink.items():
            resize(job_id, None, kept)
        for job_id, (host, indices) in decision.grow.items():
            resize(job_id, host, indices)
        for placement in decision.placements:
            start(placement)

    def wake_at(self, time: float) -> None:
        self._plan(time, Happens.WAKE)

    def release(self, job_id: int) -> list[RunningJob]:
        """The job's GPUs are free again; returns its parts."""
        parts = self.parts.pop(job_id, [])
        for part in parts:
            host = self.by_name.get(part.host)
            if host is not None:
                host.give(part.indices, part.fraction)
        return parts

    # -- the clock --------------------------------------------------------------------------

    def next_time(self) -> float | None:
        """When the next planned event is; None when none is. The clock stops there even if
        the event turns out stale (its job stopped or restarted since): the policy is called
        then with nothing new, as the live scheduler's periodic passes are."""
        return self._events[0].time if self._events else None

    def due(self, now: float) -> Iterator[Event]:
        """The events up to `now`, in time order. A job's END or STOPPED comes while the job
        still runs (the caller releases it); one planned for an attempt that is over is
        dropped."""
        while self._events and self._events[0].time <= now:
            event = heapq.heappop(self._events)
            if not self._stale(event):
                yield event

    def _stale(self, event: Event) -> bool:
        if event.happens is Happens.WAKE:
            return False
        return event.job_id not in self.parts or self._attempt.get(event.job_id) != event.attempt

    def _plan(self, time: float, happens: Happens, job_id: int = -1) -> None:
        self._seq += 1
        attempt = self._attempt.get(job_id, 0) if happens is not Happens.WAKE else 0
        heapq.heappush(self._events, Event(time, self._seq, happens, job_id, attempt))


class SliceWakeups:
    """With time slicing on, the moment a running attempt may first be stopped for fresh
    work (`sliceable_from`) is a wake-up: the policy, called then, may stop it. Each attempt
    is looked at once, when fresh work (a job that has not had its slice) is waiting."""

    def __init__(self, slice_gpu_s: float) -> None:
        self.slice_gpu_s = slice_gpu_s
        self._seen: set[tuple[int, float]] = set()
        """(job id, start) of the attempts looked at."""

    def plan(self, cluster: SimCluster, now: float, queued: Iterable[QueuedJob]) -> None:
        if self.slice_gpu_s <= 0 or all(q.served_gpu_s >= self.slice_gpu_s for q in queued):
            return
        for run in cluster.running:
            if (run.id, run.started) not in self._seen:
                self._seen.add((run.id, run.started))
                due = sliceable_from(run, self.slice_gpu_s)
                if now < due < likely_end(run, now):
                    cluster.wake_at(due)
