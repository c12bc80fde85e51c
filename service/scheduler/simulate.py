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
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, TypeVar

from service.core.defaults import DEFAULT_HALF_LIFE_S, FORECAST_SLICE_S
from service.scheduler.clock import Happens, SimCluster
from service.scheduler.forecast import Replay, in_queue_order
from service.scheduler.history import RunTimes
from service.scheduler.mechanics import RESTART_S
from service.scheduler.policy import schedule
from service.scheduler.ranking import DEFAULT_RUN_S
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


@dataclass
class _State:
    sim: SimCluster
    queued: dict[int, QueuedJob] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    usage_at: float = 0.0
    held: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    waiting: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    waited_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    gpu_s_while_waiting: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    busy_gpu_s: float = 0.0
    queued_load: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    entitled_gpu_s_while_waiting: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    capacity: float = 0.0
    idle_while_waiting_gpu_s: float = 0.0
    waiting_s: float = 0.0
    """How long some job waited (the time fragmentation is measured over)."""
    history: RunTimes = field(default_factory=lambda: RunTimes())
    group_usage: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))
    group_held: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))
    group_queued_load: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))
    group_waiting: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    group_waited_s: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))
    group_gpu_s_while_waiting: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))
    group_entitled_gpu_s: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))
    group_shares: dict[str, float] = field(default_factory=dict)
    has_groups: bool = False
    """Some job of the trace runs in a group: groups are accounted."""


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
) -> dict[str, Any]:
    """Replay `jobs`; returns the metrics as a JSON-able dict. With `estimates_every` N,
    every Nth arrival also gets its start estimated as the service would at submit time
    (`forecast` after the pass), beside the naive "queue position × mean run time / jobs
    running", and the errors against its real start are reported (`start_estimates`)."""
    config = config or PolicyConfig(policy=policy)
    config.policy = policy
    config.explain = False
    capacity = hosts * gpus_per_host
    runnable = [j for j in jobs if j.gpu_count <= capacity]
    host_list = [HostCapacity(f"h{i:03d}", [1.0] * gpus_per_host) for i in range(hosts)]
    state = _State(sim=SimCluster(host_list), capacity=float(capacity), group_shares=dict(group_shares or {}))
    state.has_groups = any(j.group is not None for j in runnable)
    sim = state.sim
    by_id = {j.id: j for j in runnable}
    arrivals = list(runnable)
    arrivals.reverse()
    finished: dict[int, float] = {}
    pass_ms: list[float] = []
    pass_cpu_ms: list[float] = []
    """The same passes in this thread's CPU time: what the policy itself costs, without the
    time other processes on a shared machine took from it."""
    with_starts_cpu_ms: list[float] = []
    """The passes that also wrote the sampled arrivals' expected starts (`estimates_every`),
    in CPU time, as the service's pass does when it writes the queue: the pass with every
    job's reason, and the first slice of the replay of the expected starts."""
    slice_cpu_ms: list[float] = []
    """The replays' further slices, which the service runs between passes."""
    estimates: dict[int, tuple[float, float]] = {}
    """Sampled job -> (forecast start, naive start), made at its arrival."""
    now = arrivals[-1].submit if arrivals else 0.0
    while True:
        upcoming = sim.next_time()
        if not arrivals and upcoming is None:
            break
        next_time = min(arrivals[-1].submit if arrivals else math.inf, math.inf if upcoming is None else upcoming)
        _advance(state, now, next_time)
        now = next_time
        for event in sim.due(now):
            if event.happens is Happens.STOPPED:
                _requeue(state, by_id[event.job_id], now, half_life_s, oracle)
                continue
            _finish(state, event.job_id, now, half_life_s)
            finished[event.job_id] = now
            done = by_id[event.job_id]
            if state.history.add(done.user, done.run_s):
                estimate, typical = state.history.estimate(done.user), state.history.typical(done.user)
                for queued in state.queued.values():
                    if queued.user == done.user:
                        queued.estimate_s, queued.typical_s = estimate, typical
        arrived: list[int] = []
        while arrivals and arrivals[-1].submit <= now:
            job = arrivals.pop()
            arrived.append(job.id)
            _enqueue(state, job, oracle)
        started, started_cpu = time.perf_counter(), time.thread_time()
        users, groups = _usage_now(state, now, half_life_s)
        fair = FairShare(usage=users, group_usage=groups, group_shares=state.group_shares)
        decision = schedule(state.queued.values(), sim.view(), fair, now, config)
        pass_ms.append((time.perf_counter() - started) * 1000)
        pass_cpu_ms.append((time.thread_time() - started_cpu) * 1000)
        sampled = [i for i in arrived if estimates_every and i % estimates_every == 0]
        if sampled:
            in_pass, slices = _estimate(state, decision, fair, sampled, (now, config), finished, by_id, estimates)
            with_starts_cpu_ms.append(in_pass)
            slice_cpu_ms.extend(slices)
        for victim in [*decision.preempt, *decision.reclaim]:
            sim.stop(victim, now)
        for placement in decision.placements:
            _start(state, by_id[placement.job_id], placement.slots, now, oracle)
    result = _metrics(runnable, finished, len(jobs) - len(runnable), state, capacity, (pass_ms, pass_cpu_ms))
    if estimates_every:
        result["start_estimates"] = _estimate_errors(estimates, by_id)
        result["passes_with_starts"] = len(with_starts_cpu_ms)
        result["p99_pass_with_starts_cpu_ms"] = round(_percentile(with_starts_cpu_ms, 0.99), 3)
        result["max_pass_with_starts_cpu_ms"] = round(max(with_starts_cpu_ms, default=0.0), 3)
        result["max_forecast_slice_cpu_ms"] = round(max(slice_cpu_ms, default=0.0), 3)
    return result


def _estimate(
    state: _State,
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


def _estimate_errors(estimates: dict[int, tuple[float, float]], by_id: dict[int, TraceJob]) -> dict[str, Any]:
    """Median and p90 of |estimate - real start| in hours, for the forecast and the naive
    guess, over the sampled jobs that waited and got a forecast (a job that starts at once
    is trivially right both ways; one too deep in the queue gets no forecast, counted)."""
    forecast_errors, naive_errors, started_at_once, missing = [], [], 0, 0
    for job_id, (guess, naive) in estimates.items():
        job = by_id[job_id]
        real = job.start if job.start is not None else job.submit
        if real <= job.submit:
            started_at_once += 1
        elif math.isinf(guess):
            missing += 1
        else:
            forecast_errors.append(abs(guess - real) / 3600)
            naive_errors.append(abs(naive - real) / 3600)
    return {
        "sampled": len(estimates),
        "started_at_once": started_at_once,
        "waited_without_forecast": missing,
        "waited_with_forecast": len(forecast_errors),
        "forecast_median_h": round(_percentile(forecast_errors, 0.5), 2),
        "forecast_p90_h": round(_percentile(forecast_errors, 0.9), 2),
        "naive_median_h": round(_percentile(naive_errors, 0.5), 2),
        "naive_p90_h": round(_percentile(naive_errors, 0.9), 2),
    }


def _advance(state: _State, start: float, end: float) -> None:
    """Account the interval [start, end): GPUs busy, users waiting and what they held."""
    if not math.isfinite(end) or end <= start:
        return
    span = end - start
    load = sum(r.gpu_load for r in state.sim.running)
    state.busy_gpu_s += span * load
    if not state.queued:
        return
    state.waiting_s += span
    state.idle_while_waiting_gpu_s += span * sum(max(0.0, f) for h in state.sim.hosts for f in h.free)
    demand = {u: state.held[u] + state.queued_load[u] for u in set(state.held) | set(state.queued_load)}
    fair = water_fill({u: d for u, d in demand.items() if d > 1e-9}, state.capacity)
    for user, count in state.waiting.items():
        if count:
            state.waited_s[user] += span
            state.gpu_s_while_waiting[user] += span * state.held[user]
            state.entitled_gpu_s_while_waiting[user] += span * fair.get(user, 0.0)
    if not state.group_shares and not state.has_groups:
        return
    groups = set(state.group_held) | set(state.group_queued_load)
    group_demand = {g: state.group_held[g] + state.group_queued_load[g] for g in groups}
    shares = {g: state.group_shares.get(g, 1.0) if g is not None else 1.0 for g in groups}
    entitled = water_fill({g: d for g, d in group_demand.items() if d > 1e-9}, state.capacity, shares)
    for group, count in state.group_waiting.items():
        if count:
            state.group_waited_s[group] += span
            state.group_gpu_s_while_waiting[group] += span * state.group_held[group]
            state.group_entitled_gpu_s[group] += span * entitled.get(group, 0.0)


def _start(state: _State, job: TraceJob, slots: list[tuple[str, tuple[int, ...]]], now: float, oracle: bool) -> None:
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
    parts = [
        RunningJob(
            id=job.id,
            user=job.user,
            priority=1,
            host=host,
            indices=indices,
            fraction=queued.fraction,
            started=now,
            limit_s=job.left if oracle else job.limit,
            estimate_s=queued.estimate_s,
            typical_s=queued.typical_s,
            served_gpu_s=job.served,
            group=job.group,
            job_gpu_load=job.gpu_count * queued.fraction if len(slots) > 1 else None,
        )
        for host, indices in slots
    ]
    state.sim.start(parts, left)
    state.held[job.user] += job.gpu_count * queued.fraction
    state.group_held[job.group] += job.gpu_count * queued.fraction


def _requeue(state: _State, job: TraceJob, now: float, half_life_s: float, oracle: bool) -> None:
    """A preempted job has checkpointed: its GPUs free up and it queues again, its run
    time left grown by RESTART_S (starting again and restoring the checkpoint)."""
    ran = now - state.sim.parts[job.id][0].started
    _finish(state, job.id, now, half_life_s)
    job.served += job.gpu_count * job.fraction * ran
    job.left = max(0.0, (job.left or 0.0) - ran) + RESTART_S
    job.queued_at = now
    _enqueue(state, job, oracle)


def _enqueue(state: _State, job: TraceJob, oracle: bool) -> None:
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
    )
    state.waiting[job.user] += 1
    state.queued_load[job.user] += job.gpu_count * job.fraction
    state.group_waiting[job.group] += 1
    state.group_queued_load[job.group] += job.gpu_count * job.fraction


def _finish(state: _State, job_id: int, now: float, half_life_s: float) -> None:
    for running in state.sim.release(job_id):
        _fold_usage(state, now, half_life_s)
        used = interval_usage(running.gpu_load, running.started, now, now, half_life_s)
        state.usage[running.user] += used
        state.group_usage[running.group] += used
        state.held[running.user] -= running.gpu_load
        state.group_held[running.group] -= running.gpu_load


def _fold_usage(state: _State, now: float, half_life_s: float) -> None:
    if now > state.usage_at:
        for user in state.usage:
            state.usage[user] = decayed(state.usage[user], state.usage_at, now, half_life_s)
        for group in state.group_usage:
            state.group_usage[group] = decayed(state.group_usage[group], state.usage_at, now, half_life_s)
        state.usage_at = now


def _usage_now(state: _State, now: float, half_life_s: float) -> tuple[dict[str, float], dict[str | None, float]]:
    """Decayed GPU-seconds per user and per group at `now`, running jobs included."""
    _fold_usage(state, now, half_life_s)
    usage, groups = dict(state.usage), dict(state.group_usage)
    for running in state.sim.running:
        used = interval_usage(running.gpu_load, running.started, now, now, half_life_s)
        usage[running.user] = usage.get(running.user, 0.0) + used
        groups[running.group] = groups.get(running.group, 0.0) + used
    return usage, groups


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def _metrics(
    jobs: list[TraceJob],
    finished: dict[int, float],
    dropped: int,
    state: _State,
    capacity: int,
    passes: tuple[list[float], list[float]],
) -> dict[str, Any]:
    pass_ms, pass_cpu_ms = passes
    jct = [finished[j.id] - j.submit for j in jobs]
    wait = [j.waited for j in jobs]
    waits: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        waits[j.user].append(j.waited)

    def while_waiting(gpu_s: dict[str, float], user: str) -> float:
        waited = state.waited_s.get(user, 0.0)
        return round(gpu_s.get(user, 0.0) / waited, 3) if waited else 0.0

    first = min((j.submit for j in jobs), default=0.0)
    makespan = max(finished.values(), default=first) - first
    shares = [state.gpu_s_while_waiting[u] / t for u, t in state.waited_s.items() if t > 0]
    jain = sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares)) if shares and any(shares) else 1.0
    return {
        "jobs": len(jobs),
        "jobs_dropped_too_large": dropped,
        "avg_jct_s": round(sum(jct) / len(jct), 1) if jct else 0.0,
        "p50_jct_s": round(_percentile(jct, 0.5), 1),
        "p95_jct_s": round(_percentile(jct, 0.95), 1),
        "avg_wait_s": round(sum(wait) / len(wait), 1) if wait else 0.0,
        "p95_wait_s": round(_percentile(wait, 0.95), 1),
        "max_wait_s": round(max(wait, default=0.0), 1),
        "makespan_s": round(makespan, 1),
        "utilization": round(state.busy_gpu_s / (capacity * makespan), 4) if makespan else 0.0,
        "fragmentation": round(state.idle_while_waiting_gpu_s / (capacity * state.waiting_s), 4)
        if state.waiting_s
        else 0.0,
        "shared_jobs": sum(1 for j in jobs if j.fraction < 1),
        "jain_fairness": round(jain, 4),
        "avg_pass_ms": round(sum(pass_ms) / len(pass_ms), 3) if pass_ms else 0.0,
        "p99_pass_ms": round(_percentile(pass_ms, 0.99), 3),
        "max_pass_ms": round(max(pass_ms, default=0.0), 3),
        "p99_pass_cpu_ms": round(_percentile(pass_cpu_ms, 0.99), 3),
        "max_pass_cpu_ms": round(max(pass_cpu_ms, default=0.0), 3),
        "per_user": {
            user: {
                "jobs": len(waits[user]),
                "p95_wait_s": round(_percentile(waits[user], 0.95), 1),
                "p99_wait_s": round(_percentile(waits[user], 0.99), 1),
                "gpus_while_waiting": while_waiting(state.gpu_s_while_waiting, user),
                "entitled_while_waiting": while_waiting(state.entitled_gpu_s_while_waiting, user),
            }
            for user in sorted(waits)
        },
        **_per_group(state),
    }


def _per_group(state: _State) -> dict[str, Any]:
    """Each group's average number of GPUs held while it had work waiting, and what it was
    entitled to then (none when the trace has no groups)."""
    if not state.has_groups:
        return {}
    rows = {}
    for group, waited in sorted(state.group_waited_s.items(), key=lambda item: item[0] or ""):
        rows[group or "(no group)"] = {
            "share": state.group_shares.get(group, 1.0) if group is not None else 1.0,
            "gpus_while_waiting": round(state.group_gpu_s_while_waiting[group] / waited, 3) if waited else 0.0,
            "entitled_while_waiting": round(state.group_entitled_gpu_s[group] / waited, 3) if waited else 0.0,
        }
    return {"per_group": rows}


Key = TypeVar("Key", str, str | None)


def water_fill(demand: dict[Key, float], capacity: float, shares: dict[Key, float] | None = None) -> dict[Key, float]:
    """Each one's max-min fair number of GPUs, by their shares (default equal): the capacity
    split by shares, nobody entitled to more than they can use (running plus waiting), what
    they leave split among the others by theirs."""
    weight = {key: (shares or {}).get(key, 1.0) for key in demand}
    order = sorted(demand, key=lambda key: demand[key] / weight[key])
    left, total, entitled = capacity, sum(weight.values()), {}
    for key in order:
        entitled[key] = min(demand[key], left * weight[key] / total) if total > 0 else 0.0
        left -= entitled[key]
        total -= weight[key]
    return entitled
