"""When will it start? The policy replayed forward from the live state.

The live scheduler, `POST /api/jobs?dry_run=true` and the trace simulator's estimate of
each arrival all call `forecast`: the same `schedule` function the passes call, run on a
copy of the queue and the cluster on a virtual clock. Running jobs end when they most
likely will (`outlook.likely_end`: the owner's median run time, or as long again as they
have run so far once past it, never past the time limit); a job the replay starts runs
for its owner's median run time (at most its limit), else its limit, else `DEFAULT_RUN_S`;
an elastic job below its full size runs as much longer as its rate there says
(`elastic.rate`), and one the policy shrinks or grows restarts with what it has left
(`resize`), as in the trace simulator. A live resize under way goes on as the live passes
will do it: the resized job restarts on the GPUs it recorded once it has checkpointed, and
the GPUs held for the job it makes room for (`Cluster.held`, `settle.hold_made_room`) stay
that job's until the call after (so a job that came since is not expected to start on them).
Nothing new arrives but the queued jobs held back by their begin alone (`towerq run
--begin`), each at its begin (`arrivals`); nobody cancels, usage is held where it is now:
an estimate, refreshed by every pass, never a promise. The replay runs on the simulated
cluster of `clock`, the trace simulator's too. A job the replay stops (time slicing, preemption) frees its
GPUs `CHECKPOINT_S` later and leaves the replay: it queues again behind the fresh work it
made room for, and is not forecast. With time slicing on, the moment a running job may
first be stopped (`sliceable_from`) is an event too, while fresh work waits.

Cost is bounded: only the first `FORECAST_JOBS` waiting jobs (in queue order) are replayed,
over at most `MAX_EVENTS` job ends and `HORIZON_S` ahead; the rest get no estimate. Each
event is a policy call over the whole cluster, so on 256 busy GPUs the replay costs ~0.1-0.2 s.
The live scheduler starts a replay (`Replay`) in each pass that writes the queue's positions,
after the pass's launches are out, within `defaults.FORECAST_COST_RATIO` of its time, and does
it a slice at a time (`defaults.FORECAST_SLICE_S`): in that pass, then between passes.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from service.scheduler.clock import Happens, SimCluster, SliceWakeups
from service.scheduler.costs import CHECKPOINT_S, STOP_COST_S
from service.scheduler.elastic import rate
from service.scheduler.outlook import likely_end
from service.scheduler.policy import schedule
from service.scheduler.ranking import DEFAULT_RUN_S
from service.scheduler.settle import Target, hold_made_room, still_free
from service.scheduler.types import (
    Cluster,
    FairShare,
    HostCapacity,
    Pending,
    Placement,
    PolicyConfig,
    QueuedJob,
    RunningJob,
)

FORECAST_JOBS = 100
MAX_EVENTS = 100
HORIZON_S = 30 * 86400.0


@dataclass(frozen=True, slots=True)
class Forecast:
    start: float
    host: str


def run_time(job: QueuedJob) -> float:
    """How long a job the replay starts is taken to run: its owner's median run time, never
    above its time limit; else its limit; else `DEFAULT_RUN_S`."""
    for known in (job.likely_run_s, job.limit_s):
        if known is not None:
            return known
    return DEFAULT_RUN_S


def in_queue_order(
    queued: Iterable[QueuedJob], placements: Iterable[Placement], pending: Iterable[Pending]
) -> list[QueuedJob]:
    """The jobs of `queued` in the order a replay takes them: those a pass placed first, then
    the waiting by their queue position (a job not among `queued` is left out)."""
    by_id = {job.id: job for job in queued}
    order = [p.job_id for p in placements] + [p.job_id for p in sorted(pending, key=lambda p: p.position)]
    return [by_id[i] for i in order if i in by_id]


class Replay:
    """The forecast as work done a slice at a time (`run`), so that neither a pass nor one
    asked for while it goes on waits for all of it: each slice ends once it has taken its
    budget, one policy call past it at most. What it finds does not depend on how it was
    sliced: the replay moves on its own copy of the queue and the cluster."""

    def __init__(
        self,
        queued: Iterable[QueuedJob],
        cluster: Cluster,
        fair_share: FairShare,
        now: float,
        config: PolicyConfig,
        arrivals: Iterable[tuple[float, QueuedJob]] = (),
    ) -> None:
        self.queue = {job.id: job for job in list(queued)[:FORECAST_JOBS]}
        self.arrivals = sorted(arrivals, key=lambda arrival: (arrival[0], arrival[1].id))[:FORECAST_JOBS]
        """Jobs that join the queue later, soonest first: (when, the job)."""
        hosts = [HostCapacity(h.name, list(h.free), h.unusable) for h in cluster.hosts]
        self.sim = SimCluster(hosts, [copy.copy(r) for r in cluster.running])
        self.held = list(cluster.held)
        """The GPUs the pass held (the first call's); later calls hold anew (`_hold`)."""
        self.first = True
        self.resumes: dict[int, float] = {}
        """A live resize under way: the work its job had left at its old size (its restart)."""
        self.made_room: dict[int, tuple[float, list[Target]]] = {}
        """A queued job live resizes make room for: when the last of them has checkpointed,
        and the hosts they free (as `hold_made_room` reads a resize's record)."""
        for run in self.sim.running:
            end = likely_end(run, now)
            if run.stopping:  # cancel, preemption, time slice, resize: gone once it has checkpointed
                if run.restarts_on is not None and run.full_gpu_count is not None:
                    self.resumes[run.id] = max(0.0, end - now) * rate(len(run.indices), run.full_gpu_count)
                end = min(end, now + CHECKPOINT_S)
                if run.shrinking_for is not None:
                    until, freed = self.made_room.get(run.shrinking_for, (end, []))
                    freed.append(Target(run.host, (), for_job=run.shrinking_for, source=run.host))
                    self.made_room[run.shrinking_for] = (max(until, end), freed)
            self.sim.ends_at(run.id, end)
        for at, _ in self.arrivals:
            self.sim.wake_at(at)
        self.sim.reservations = list(cluster.reservations)
        for kept in cluster.reservations:  # a window's start and end change who may start
            for moment in (kept.start, kept.end):
                if moment > now:
                    self.sim.wake_at(moment)
        self.slices = SliceWakeups(config.demote_after_gpu_s)
        self.fair_share = fair_share
        self.config = replace(config, explain=False)
        self.now = self.clock = now
        self.events = 0
        self.found: dict[int, Forecast] = {}
        """Expected (start, host) of each job found to start so far."""
        self.done = False

    def run(self, budget_s: float = math.inf, timer: Callable[[], float] = time.perf_counter) -> bool:
        """Go on until the replay is over or `budget_s` (as `timer` counts) is spent; True
        once it is over and `found` is final."""
        deadline = timer() + budget_s
        while not self.done:
            self._step()
            if timer() >= deadline:
                break
        return self.done

    def _start(self, job: QueuedJob, slots: list[tuple[str, tuple[int, ...]]], clock: float) -> None:
        """`job` starts in the replay on `slots`; an elastic one below its full size runs for
        as much longer as its rate there says (`elastic.rate`), and may be resized later."""
        run_s = run_time(job)
        elastic = job.elastic and len(slots) == 1
        size = sum(len(indices) for _, indices in slots)
        if elastic:
            run_s /= rate(size, job.gpu_count)
        parts = job.parts_on(slots, clock)
        for part in parts:
            part.estimate_s = part.typical_s = run_s
        self.sim.start(parts, run_s)

    def _place(self, placement: Placement, clock: float) -> None:
        job = self.queue.pop(placement.job_id)
        self.found[job.id] = Forecast(clock, placement.host)
        self._start(job, placement.slots, clock)

    def _step(self) -> None:
        """One policy call at the replay's clock, then on to the next event."""
        while self.arrivals and self.arrivals[0][0] <= self.clock:
            _, job = self.arrivals.pop(0)
            self.queue[job.id] = job
        if not (self.queue or self.arrivals) or self.events > MAX_EVENTS or self.clock > self.now + HORIZON_S:
            self.done = True
            return
        sim, clock = self.sim, self.clock
        view = sim.view()
        self._hold(view)
        decision = schedule(self.queue.values(), view, self.fair_share, clock, self.config)
        sim.apply(
            decision,
            clock,
            lambda job_id, host, indices: resize(sim, job_id, host, indices, clock),
            lambda placement: self._place(placement, clock),
        )
        self.slices.plan(sim, clock, self.queue.values())
        upcoming = sim.next_time()
        if upcoming is None:
            self.done = True  # nothing will free up: the rest cannot start (a host down, too large)
            return
        self.clock = max(clock, upcoming)
        for event in sim.due(self.clock):
            if event.happens is not Happens.WAKE:  # ended, or stopped: it leaves the replay
                parts = sim.release(event.job_id)
                if event.job_id in self.resumes:  # a live resize: it goes on, on its new GPUs
                    self._resume(parts, self.resumes.pop(event.job_id), self.clock)
            self.events += 1  # a slice that is up is an event too: the next call may stop that job

    def _hold(self, view: Cluster) -> None:
        """The GPUs held in this call: the pass's in the first; after it, those
        `hold_made_room` holds for each queued job that live resizes make room for, up to
        the call after the last of them has checkpointed (where it starts on them)."""
        if self.first:
            self.first = False
            view.held = list(self.held)
            return
        records = [
            target
            for job_id, (until, freed) in self.made_room.items()
            if job_id in self.queue and self.clock <= until
            for target in freed
        ]
        if records:
            hold_made_room(list(self.queue.values()), view, dict(enumerate(records)))

    def _resume(self, parts: list[RunningJob], work_s: float, clock: float) -> None:
        """A live resize's job, checkpointed, restarts on the GPUs its record names that are
        still free (`settle.still_free`, as live; else it leaves the replay) with the work it
        had left, at its new size's rate, and the restart's cost."""
        own = next((p for p in parts if p.restarts_on is not None), None)
        if own is None or own.restarts_on is None or own.full_gpu_count is None:
            return
        name, gpus = own.restarts_on
        host = self.sim.by_name.get(name)
        if host is None:
            return
        full = own.full_gpu_count
        indices = still_free(host, gpus, own.fraction, own.min_gpu_count or full, full)
        if indices is None:
            return
        wall = work_s / rate(len(indices), full) + STOP_COST_S
        again = replace(
            own,
            host=name,
            indices=indices,
            started=clock,
            stopping=False,
            shrinking_for=None,
            moving=False,
            restarts_on=None,
            measured_end=None,
        )
        again.estimate_s = again.typical_s = wall
        self.sim.start([again], wall)


def resize(sim: SimCluster, job_id: int, host: str | None, indices: tuple[int, ...], now: float) -> None:
    """An elastic job of the replay restarts from its checkpoint on `indices` of its host (or
    of `host`): what it had left to run at its old size (until its planned end) takes as
    long as it does at the new size's rate (`elastic.rate`), and the restart `STOP_COST_S`
    more. Nothing when it is not running (stopped meanwhile) or not elastic."""
    end, parts = sim.end_of(job_id), sim.parts.get(job_id)
    full = parts[0].full_gpu_count if parts and len(parts) == 1 else None
    if end is None or not parts or full is None:
        return
    part = parts[0]
    work_s = max(0.0, end - now) * rate(len(part.indices), full)
    sim.release(job_id)
    wall = work_s / rate(len(indices), full) + STOP_COST_S
    again = replace(part, host=host or part.host, indices=indices, started=now, stopping=False)
    again.estimate_s = again.typical_s = wall  # what the policy's later calls take its end to be
    again.measured_end = None
    sim.start([again], wall)


def forecast(
    queued: Iterable[QueuedJob],
    cluster: Cluster,
    fair_share: FairShare,
    now: float,
    config: PolicyConfig,
    arrivals: Iterable[tuple[float, QueuedJob]] = (),
) -> dict[int, Forecast]:
    """Expected (start, host) of each of `queued` (taken in the order given, at most
    `FORECAST_JOBS`) and of `arrivals` that starts within the horizon; jobs starting at
    `now` included."""
    replay = Replay(queued, cluster, fair_share, now, config, arrivals)
    replay.run()
    return replay.found
