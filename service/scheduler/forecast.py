"""When will it start? The policy replayed forward from the live state.

The live scheduler, `POST /api/jobs?dry_run=true` and the trace simulator's estimate of
each arrival all call `forecast`: the same `schedule` function the passes call, run on a
copy of the queue and the cluster on a virtual clock. Running jobs end when they most
likely will (`capacity.likely_end`: the owner's median run time, or as long again as they
have run so far once past it, never past the time limit); a job the replay starts runs
for its owner's median run time (at most its limit), else its limit, else `DEFAULT_RUN_S`.
Nothing new arrives, nobody cancels, usage is held where it is now: an estimate, refreshed
by every pass, never a promise. The replay runs on the simulated cluster of `clock`, the
trace simulator's too. A job the replay stops (time slicing, preemption) frees its
GPUs `CHECKPOINT_S` later and leaves the replay: it queues again behind the fresh work it
made room for, and is not forecast. With time slicing on, the moment a running job may
first be stopped (`sliceable_from`) is an event too, while fresh work waits.

Cost is bounded: only the first `FORECAST_JOBS` waiting jobs (in queue order) are replayed,
over at most `MAX_EVENTS` job ends and `HORIZON_S` ahead; the rest get no estimate. Each
event is a policy call over the whole cluster, so on 256 busy GPUs the replay costs ~0.1-0.2 s.
The live scheduler replays in each pass that writes the queue's positions, after the pass's
launches are out, within `defaults.FORECAST_COST_RATIO` of its time.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, replace

from service.scheduler.capacity import likely_end
from service.scheduler.clock import Happens, SimCluster, SliceWakeups
from service.scheduler.policy import CHECKPOINT_S, schedule
from service.scheduler.ranking import DEFAULT_RUN_S
from service.scheduler.types import Cluster, FairShare, HostCapacity, PolicyConfig, QueuedJob, RunningJob

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


def forecast(
    queued: Iterable[QueuedJob],
    cluster: Cluster,
    fair_share: FairShare,
    now: float,
    config: PolicyConfig,
) -> dict[int, Forecast]:
    """Expected (start, host) of each of `queued` (taken in the order given, at most
    `FORECAST_JOBS`) that starts within the horizon; jobs starting at `now` included."""
    queue = {job.id: job for job in list(queued)[:FORECAST_JOBS]}
    hosts = [HostCapacity(h.name, list(h.free), h.unusable) for h in cluster.hosts]
    sim = SimCluster(hosts, [copy.copy(r) for r in cluster.running])
    for run in sim.running:
        end = likely_end(run, now)
        if run.stopping:  # cancel, preemption, time slice: gone once it has checkpointed
            end = min(end, now + CHECKPOINT_S)
        sim.ends_at(run.id, end)
    sim.reservations = list(cluster.reservations)
    for kept in cluster.reservations:  # a window's start and end change who may start
        for moment in (kept.start, kept.end):
            if moment > now:
                sim.wake_at(moment)
    slices = SliceWakeups(config.demote_after_gpu_s)
    replay = replace(config, explain=False)
    found: dict[int, Forecast] = {}
    clock, events = now, 0
    while queue and events <= MAX_EVENTS and clock <= now + HORIZON_S:
        decision = schedule(queue.values(), sim.view(), fair_share, clock, replay)
        for victim in [*decision.preempt, *decision.reclaim]:
            sim.stop(victim, clock)
        for placement in decision.placements:
            job = queue.pop(placement.job_id)
            found[job.id] = Forecast(clock, placement.host)
            parts = [
                RunningJob(
                    job.id, job.user, job.priority, host, indices, job.fraction, clock, job.limit_s, group=job.group
                )
                for host, indices in placement.slots
            ]
            run_s = run_time(job)
            for part in parts:
                part.estimate_s = part.typical_s = run_s
                part.served_gpu_s = job.served_gpu_s
                if len(parts) > 1:
                    part.job_gpu_load = job.gpus * job.fraction
            sim.start(parts, run_s)
        slices.plan(sim, clock, queue.values())
        upcoming = sim.next_time()
        if upcoming is None:
            break  # nothing will free up: the rest cannot start (a host down, too large)
        clock = max(clock, upcoming)
        for event in sim.due(clock):
            if event.happens is not Happens.WAKE:  # ended, or stopped: it leaves the replay
                sim.release(event.job_id)
            events += 1  # a slice that is up is an event too: the next call may stop that job
    return found
