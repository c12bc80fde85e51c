"""When will it start? The policy replayed forward from the live state.

The live scheduler, `POST /api/jobs?dry_run=true` and the trace simulator's estimate of
each arrival all call `forecast`: the same `schedule` function the passes call, run on a
copy of the queue and the cluster on a virtual clock. Running jobs end when they most
likely will (`capacity.likely_end`: the owner's median run time, or as long again as they
have run so far once past it, never past the time limit); a job the replay starts runs
for its owner's median run time (at most its limit), else its limit, else `DEFAULT_RUN_S`.
Nothing new arrives, nobody cancels, usage is held where it is now: an estimate, refreshed
by every pass, never a promise. A job the replay stops (time slicing, preemption) frees its
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
import heapq
from collections.abc import Iterable
from dataclasses import dataclass, replace

from service.scheduler.capacity import likely_end
from service.scheduler.policy import CHECKPOINT_S, schedule, sliceable_from
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
    by_name = {h.name: h for h in hosts}
    running = [copy.copy(r) for r in cluster.running]
    ends: list[tuple[float, int, RunningJob | None]] = []
    """(time, tie-break, the job that ends then, or None: a job's slice is up then)."""
    for n, run in enumerate(running):
        end = likely_end(run, now)
        if run.stopping:  # cancel, preemption, time slice: gone once it has checkpointed
            end = min(end, now + CHECKPOINT_S)
        heapq.heappush(ends, (end, n, run))
    replay = replace(config, explain=False)
    found: dict[int, Forecast] = {}
    clock, events, counter = now, 0, len(running)
    slice_s = config.demote_after_gpu_s
    slices_due = {id(r) for r in running} if slice_s > 0 else set()
    """Running jobs whose slice has not been put on the event heap yet."""
    while queue and events <= MAX_EVENTS and clock <= now + HORIZON_S:
        decision = schedule(queue.values(), Cluster(hosts, running), fair_share, clock, replay)
        for run in running:
            if run.id in decision.preempt and not run.stopping:
                run.stopping = True
                counter += 1
                heapq.heappush(ends, (clock + CHECKPOINT_S, counter, run))
        for placement in decision.placements:
            job = queue.pop(placement.job_id)
            found[job.id] = Forecast(clock, placement.host)
            for host, indices in placement.slots:
                for i in indices:
                    by_name[host].free[i] -= job.fraction
                started = RunningJob(job.id, job.user, job.priority, host, indices, job.fraction, clock, job.limit_s)
                started.estimate_s = started.typical_s = run_s = run_time(job)
                started.served_gpu_s = job.served_gpu_s
                running.append(started)
                if slice_s > 0:
                    slices_due.add(id(started))
                counter += 1
                heapq.heappush(ends, (clock + run_s, counter, started))
        if slices_due and any(q.served_gpu_s < slice_s for q in queue.values()):  # fresh work waits
            for run in running:
                if id(run) in slices_due:
                    slices_due.discard(id(run))
                    due = sliceable_from(run, slice_s)
                    if clock < due < likely_end(run, clock):
                        counter += 1
                        heapq.heappush(ends, (due, counter, None))
        if not ends:
            break  # nothing will free up: the rest cannot start (a host down, too large)
        clock = max(clock, ends[0][0])
        while ends and ends[0][0] <= clock:
            _, _, done = heapq.heappop(ends)
            if done is None:
                events += 1  # a slice is up: the next call may stop that job
                continue
            if not any(r is done for r in running):
                continue  # stopped, and already gone at the end of its checkpoint
            running.remove(done)
            host_free = by_name.get(done.host)
            for i in done.indices:
                if host_free is not None and i < len(host_free.free) and i not in host_free.unusable:
                    host_free.free[i] = min(1.0, host_free.free[i] + done.fraction)
            events += 1
    return found
