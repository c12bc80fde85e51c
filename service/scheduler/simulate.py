"""`towerq simulate`: replay a job trace through the scheduling policy on a virtual clock.

The simulator calls the very `schedule` function the live scheduler calls, with the same
inputs: the queue, free capacity per host and GPU, the running jobs, and each user's
decayed GPU-seconds (same half-life as the service). A pass runs after every batch of
events at one instant (arrivals, completions). Durations are the jobs' true run times;
the policy sees them, as time limits, only with `oracle=True`.

A trace job needing more GPUs than one host has takes whole hosts (as the Helios
simulator does); jobs larger than the whole cluster are left out and counted. An optional
`gpu_fraction` column (0 < f <= 1, one-GPU jobs only; empty or absent: 1) makes a job share
a GPU as the live scheduler packs them: jobs whose fractions sum to at most 1 share it.
An optional `time_limit_s` column (> 0; empty or absent: none) gives a job a time limit,
which the policy sees as the live one does; a job that runs past its limit is stopped
there, as the worker stops it.

Starts, ends and stops happen on the simulated cluster of `clock`, the forecast's too. With
time slicing on (`PolicyConfig.demote_after_gpu_s`), a job the policy stops keeps running
`CHECKPOINT_S` (it checkpoints), then queues again with the run time it has left
plus `RESTART_S` (a new process, its graph built, the checkpoint restored).

Metrics: job completion time (JCT = finish - submit), wait (all the time it spent queued:
start - submit, plus the time queued again after each stop), makespan
(first submit to last finish), utilization (GPU-seconds used / offered over the
makespan), fragmentation (the share of the capacity left idle while some job waited: GPUs
or parts of GPUs no waiting job could use), Jain's fairness index over users' average number of GPUs held while they had
work waiting, and the wall time of the policy call per pass (and its CPU time, which
other processes on a busy machine do not inflate).

With groups (the trace's `group` column; shares from `group_shares`, default 1), fair share
is two-level as in the service, and `per_group` reports each group's average number of
GPUs held while it had work waiting, beside what it was entitled to then: its share of the
cluster, split max-min among the groups with work by their shares (`water_fill`).
"""

from __future__ import annotations

import functools
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

from service.core.defaults import DEFAULT_HALF_LIFE_S, FORECAST_SLICE_S
from service.scheduler.clock import Event, Happens, SimCluster
from service.scheduler.costs import MIN_RUN_S, RESTART_S, STOP_COST_S
from service.scheduler.elastic import rate
from service.scheduler.forecast import Replay, in_queue_order
from service.scheduler.policy import schedule
from service.scheduler.ranking import DEFAULT_RUN_S
from service.scheduler.sim_metrics import SimState, advance, estimate_errors, metrics, percentile
from service.scheduler.trace import TraceJob
from service.scheduler.types import (
    Decision,
    FairShare,
    HostCapacity,
    Policy,
    PolicyConfig,
    QueuedJob,
    RunningJob,
)
from service.scheduler.usage import decayed, interval_usage

P = ParamSpec("P")
R = TypeVar("R")


def _without_full_collections(replay: Callable[P, R]) -> Callable[P, R]:
    """The trace lives as long as the replay: it is kept out of the garbage collector's full
    passes meanwhile (as the scheduler keeps what it loads at startup out of them), so that
    a pass's time is the policy's, not a walk over the whole trace."""

    @functools.wraps(replay)
    def frozen(*args: P.args, **kwargs: P.kwargs) -> R:
        gc.freeze()
        try:
            return replay(*args, **kwargs)
        finally:
            gc.unfreeze()

    return frozen


@_without_full_collections
def simulate(
    jobs: list[TraceJob],
    hosts: int,
    gpus_per_host: int,
    policy: Policy,
    oracle: bool = False,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    config: PolicyConfig | None = None,
    estimates_every: int = 0,
    group_shares: dict[str, float] | None = None,
    elastic: float = 0.0,
) -> dict[str, Any]:
    """Replay `jobs`; returns the metrics as a JSON-able dict. With `estimates_every` N,
    every Nth arrival also gets its start estimated as the service would at submit time
    (`forecast` after the pass), beside the naive "queue position × mean run time / jobs
    running", and the errors against its real start are reported (`start_estimates`). With
    `elastic` above 0, that share of the jobs on 2 to one host's GPUs is elastic down to 1
    GPU (chosen by id, the same ones in every replay: `is_elastic`), and the resizes are
    counted (`resizes`, `resizes_per_elastic_job`)."""
    config = config or PolicyConfig(policy=policy)
    config.policy = policy
    config.explain = False
    capacity = hosts * gpus_per_host
    runnable = [j for j in jobs if j.gpu_count <= capacity]
    for job in runnable:
        if is_elastic(job, elastic, gpus_per_host):
            job.min_gpu_count = 1
    host_list = [HostCapacity(f"h{i:03d}", [1.0] * gpus_per_host) for i in range(hosts)]
    state = SimState(sim=SimCluster(host_list), capacity=float(capacity), group_shares=dict(group_shares or {}))
    state.has_groups = any(j.group is not None for j in runnable)
    run = _Run(state, {j.id: j for j in runnable}, config, half_life_s, oracle, estimates_every)
    arrivals = list(reversed(runnable))
    now = arrivals[-1].submit if arrivals else 0.0
    while arrivals or state.sim.next_time() is not None:
        upcoming = state.sim.next_time()
        next_time = min(arrivals[-1].submit if arrivals else math.inf, math.inf if upcoming is None else upcoming)
        advance(state, now, next_time)
        now = next_time
        for event in state.sim.due(now):
            run.ended(event, now)
        arrived: list[int] = []
        while arrivals and arrivals[-1].submit <= now:
            job = arrivals.pop()
            arrived.append(job.id)
            _enqueue(state, job, oracle)
        run.pass_at(now, arrived)
    timings = run.timings
    result = metrics(
        runnable, run.finished, len(jobs) - len(runnable), state, capacity, (timings.pass_ms, timings.pass_cpu_ms)
    )
    if elastic > 0:
        resized = [j.resizes for j in runnable if j.min_gpu_count is not None]
        result["elastic_jobs"] = len(resized)
        result["resizes"] = sum(resized)
        result["resizes_per_elastic_job"] = round(sum(resized) / len(resized), 3) if resized else 0.0
        result["shrinks"], result["grows"], result["moves"] = run.shrinks, run.grows, run.moves
    if estimates_every:
        result["start_estimates"] = estimate_errors(run.estimates, run.by_id)
        result.update(timings.with_starts())
    return result


@dataclass
class _Timings:
    """The policy's time per pass: wall and this thread's CPU time (what the policy itself
    costs, without the time other processes on a shared machine took from it)."""

    pass_ms: list[float] = field(default_factory=list)
    pass_cpu_ms: list[float] = field(default_factory=list)
    with_starts_cpu_ms: list[float] = field(default_factory=list)
    """The passes that also wrote the sampled arrivals' expected starts (`estimates_every`),
    in CPU time, as the service's pass does when it writes the queue: the pass with every
    job's reason, and the first slice of the replay of the expected starts."""
    slice_cpu_ms: list[float] = field(default_factory=list)
    """The replays' further slices, which the service runs between passes."""

    def with_starts(self) -> dict[str, Any]:
        return {
            "passes_with_starts": len(self.with_starts_cpu_ms),
            "p99_pass_with_starts_cpu_ms": round(percentile(self.with_starts_cpu_ms, 0.99), 3),
            "max_pass_with_starts_cpu_ms": round(max(self.with_starts_cpu_ms, default=0.0), 3),
            "max_forecast_slice_cpu_ms": round(max(self.slice_cpu_ms, default=0.0), 3),
        }


@dataclass
class _Run:
    """One replay's moves: a job's end or stop, and a pass of the policy with its results."""

    state: SimState
    by_id: dict[int, TraceJob]
    config: PolicyConfig
    half_life_s: float
    oracle: bool
    estimates_every: int
    finished: dict[int, float] = field(default_factory=dict)
    estimates: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Sampled job -> (forecast start, naive start), made at its arrival."""
    timings: _Timings = field(default_factory=_Timings)
    shrinks: int = 0
    grows: int = 0
    """Elastic jobs' resizes (a move to another host counts as a growth)."""
    moves: int = 0
    """Of `grows`, those that moved a job at its size to free its host for another."""

    def ended(self, event: Event, now: float) -> None:
        state = self.state
        if event.happens is Happens.WAKE:
            return  # the pass that follows may decide anew (an elastic job may grow now)
        if event.happens is Happens.STOPPED:
            _requeue(state, self.by_id[event.job_id], now, self.half_life_s, self.oracle)
            return
        _finish(state, event.job_id, now, self.half_life_s)
        self.finished[event.job_id] = now
        done = self.by_id[event.job_id]
        if state.history.add(done.user, done.run_s):
            estimate, typical = state.history.estimate(done.user), state.history.typical(done.user)
            for queued in state.queued.values():
                if queued.user == done.user:
                    queued.estimate_s, queued.typical_s = estimate, typical

    def pass_at(self, now: float, arrived: list[int]) -> None:
        state, timings = self.state, self.timings
        started, started_cpu = time.perf_counter(), time.thread_time()
        users, groups = _usage_now(state, now, self.half_life_s)
        fair = FairShare(usage=users, group_usage=groups, group_shares=state.group_shares)
        decision = schedule(state.queued.values(), state.sim.view(), fair, now, self.config)
        timings.pass_ms.append((time.perf_counter() - started) * 1000)
        timings.pass_cpu_ms.append((time.thread_time() - started_cpu) * 1000)
        sampled = [i for i in arrived if self.estimates_every and i % self.estimates_every == 0]
        if sampled:
            in_pass, slices = _estimate(
                state, decision, fair, sampled, (now, self.config), self.finished, self.by_id, self.estimates
            )
            timings.with_starts_cpu_ms.append(in_pass)
            timings.slice_cpu_ms.extend(slices)
        self.shrinks += len(decision.shrink)
        self.grows += len(decision.grow)
        self.moves += len(decision.moved_for)
        state.sim.apply(
            decision,
            now,
            lambda job_id, host, indices: self.resize(self.by_id[job_id], host, indices, now),
            lambda placement: _start(state, self.by_id[placement.job_id], placement.slots, now, self.oracle),
        )

    def resize(self, job: TraceJob, host: str | None, indices: tuple[int, ...], now: float) -> None:
        """An elastic job stops at a checkpoint and starts again from it on `indices` of its
        host (or of `host`): what it trained so far is counted at its old size's rate, and
        the new attempt pays `STOP_COST_S` (the checkpoint and the restart) on the new GPUs.
        The new attempt goes on with the job's run (`run_served_gpu_s` is kept), as time
        slicing counts it."""
        state = self.state
        part = state.sim.parts[job.id][0]
        ran = now - part.started
        _finish(state, job.id, now, self.half_life_s)
        job.served += part.gpu_load * ran
        job.left = max(0.0, (job.left or 0.0) - ran * rate(len(part.indices), job.gpu_count))
        job.resizes += 1
        wall = job.left / rate(len(indices), job.gpu_count) + STOP_COST_S
        again = replace(
            part, host=host or part.host, indices=indices, started=now, served_gpu_s=job.served, stopping=False
        )
        again.limit_s = wall if self.oracle else again.limit_s
        _run(state, job, [again], wall)


def _estimate(
    state: SimState,
    decision: Decision,
    fair: FairShare,
    sampled: list[int],
    when: tuple[float, PolicyConfig],
    finished: dict[int, float],
    by_id: dict[int, TraceJob],
    estimates: dict[int, tuple[float, float]],
) -> tuple[float, list[float]]:
    """Estimates of the sampled arrivals' starts, as the service would make them now; and,
    in this thread's CPU ms, what the service's pass that writes them costs (the pass with
    every job's reason, and the first slice of the replay, `FORECAST_SLICE_S`), and each
    further slice of the replay (the service runs those between passes)."""
    now, config = when
    cluster = state.sim.view()
    started = time.thread_time()
    # The replay keeps no reasons; the service's pass does, and orders the queue by them.
    explained = schedule(state.queued.values(), cluster, fair, now, replace(config, explain=True))
    order = in_queue_order(state.queued.values(), decision.placements, explained.pending)
    replay = Replay(order, cluster, fair, now, config)
    replay.run(FORECAST_SLICE_S, time.thread_time)
    in_pass, slices = (time.thread_time() - started) * 1000, []
    while not replay.done:
        began = time.thread_time()
        replay.run(FORECAST_SLICE_S, time.thread_time)
        slices.append((time.thread_time() - began) * 1000)
    found = replay.found
    position = {p.job_id: p.position for p in explained.pending}
    done = [by_id[i].run_s for i in finished]
    mean_run = sum(done) / len(done) if done else DEFAULT_RUN_S
    at_once = max(1, len(state.sim.parts))
    for job_id in sampled:
        guess = found.get(job_id)
        naive = now + position.get(job_id, 0) * mean_run / at_once
        estimates[job_id] = (guess.start if guess is not None else math.inf, naive)
    return in_pass, slices


def _start(state: SimState, job: TraceJob, slots: list[tuple[str, tuple[int, ...]]], now: float, oracle: bool) -> None:
    """Start `job` on `slots`, to end when the run time it has left is up."""
    queued = state.queued.pop(job.id)
    state.waiting[job.user] -= 1
    state.queued_load[job.user] -= job.gpu_count * queued.fraction
    state.group_waiting[job.group] -= 1
    state.group_queued_load[job.group] -= job.gpu_count * queued.fraction
    if job.start is None:
        job.start = now
    left = job.run_s if job.left is None else job.left
    job.left = left
    job.waited += now - (job.queued_at if job.queued_at is not None else job.submit)
    size = sum(len(indices) for _, indices in slots)
    elastic = queued.elastic and len(slots) == 1
    wall = left / rate(size, job.gpu_count) if elastic else left
    parts = queued.parts_on(slots, now)
    for part in parts:
        part.limit_s = wall if oracle else job.limit
        part.run_served_gpu_s = job.served
    _run(state, job, parts, wall)


def _run(state: SimState, job: TraceJob, parts: list[RunningJob], wall: float) -> None:
    """`job`'s attempt runs on `parts` for `wall` seconds. An elastic job below its full
    size is looked at again once it may grow (`MIN_RUN_S`), even if nothing else happens."""
    state.sim.start(parts, wall)
    load = _load(job, parts)
    state.held[job.user] += load
    state.group_held[job.group] += load
    size = sum(len(part.indices) for part in parts)
    if parts[0].elastic and size < job.gpu_count:
        state.sim.wake_at(parts[0].started + MIN_RUN_S)


def _requeue(state: SimState, job: TraceJob, now: float, half_life_s: float, oracle: bool) -> None:
    """A preempted job has checkpointed: its GPUs free up and it queues again, its run
    time left grown by RESTART_S (starting again and restoring the checkpoint)."""
    parts = state.sim.parts[job.id]
    ran = now - parts[0].started
    size = sum(len(part.indices) for part in parts)
    _finish(state, job.id, now, half_life_s)
    job.served += _load(job, parts) * ran
    progress = ran * rate(size, job.gpu_count) if parts[0].elastic else ran
    job.left = max(0.0, (job.left or 0.0) - progress) + RESTART_S
    job.queued_at = now
    _enqueue(state, job, oracle)


def _enqueue(state: SimState, job: TraceJob, oracle: bool) -> None:
    """Queue `job` (on arrival, or again after a stop) as the policy sees it."""
    state.queued[job.id] = QueuedJob(
        job.id,
        job.user,
        1,
        job.gpu_count,
        job.fraction,
        job.submit,
        limit_s=(job.run_s if job.left is None else job.left) if oracle else job.limit,
        estimate_s=state.history.estimate(job.user),
        typical_s=state.history.typical(job.user),
        served_gpu_s=job.served,
        group=job.group,
        min_gpu_count=job.min_gpu_count,
    )
    state.waiting[job.user] += 1
    state.queued_load[job.user] += job.gpu_count * job.fraction
    state.group_waiting[job.group] += 1
    state.group_queued_load[job.group] += job.gpu_count * job.fraction


def _load(job: TraceJob, parts: list[RunningJob]) -> float:
    """The GPUs `job` holds on `parts`, by fraction: an elastic job's its own size, any
    other's its GPU count (a job larger than a host takes whole hosts, and holds no more)."""
    if parts[0].elastic:
        return sum(part.gpu_load for part in parts)
    return job.gpu_count * job.fraction


def is_elastic(job: TraceJob, share: float, gpus_per_host: int) -> bool:
    """Whether `job` is elastic in a replay with `share` of its multi-GPU jobs elastic: one
    on 2 to `gpus_per_host` GPUs whose id falls in the share (a fixed scramble of the id, so
    a half is every other job of any size, not the early ones). Its time limit, if any,
    counts as work at its full size (a live one is a wall clock's: an approximation)."""
    if share <= 0 or not 1 < job.gpu_count <= gpus_per_host:
        return False
    return (job.id * 2654435761) % 1000 < share * 1000


def _finish(state: SimState, job_id: int, now: float, half_life_s: float) -> None:
    for running in state.sim.release(job_id):
        _fold_usage(state, now, half_life_s)
        used = interval_usage(running.gpu_load, running.started, now, now, half_life_s)
        state.usage[running.user] += used
        state.group_usage[running.group] += used
        state.held[running.user] -= running.gpu_load
        state.group_held[running.group] -= running.gpu_load


def _fold_usage(state: SimState, now: float, half_life_s: float) -> None:
    if now > state.usage_at:
        for user in state.usage:
            state.usage[user] = decayed(state.usage[user], state.usage_at, now, half_life_s)
        for group in state.group_usage:
            state.group_usage[group] = decayed(state.group_usage[group], state.usage_at, now, half_life_s)
        state.usage_at = now


def _usage_now(state: SimState, now: float, half_life_s: float) -> tuple[dict[str, float], dict[str | None, float]]:
    """Decayed GPU-seconds per user and per group at `now`, running jobs included."""
    _fold_usage(state, now, half_life_s)
    usage, groups = dict(state.usage), dict(state.group_usage)
    for running in state.sim.running:
        used = interval_usage(running.gpu_load, running.started, now, now, half_life_s)
        usage[running.user] = usage.get(running.user, 0.0) + used
        groups[running.group] = groups.get(running.group, 0.0) + used
    return usage, groups
