"""What a replay of `towerq simulate` measures: its state's ledger of waits and GPU-seconds
held, accounted interval by interval (`advance`), and the figures made of it (`metrics`)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, TypeVar

from service.scheduler.clock import SimCluster
from service.scheduler.history import RunTimes
from service.scheduler.trace import TraceJob
from service.scheduler.types import QueuedJob


@dataclass
class SimState:
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


def estimate_errors(estimates: dict[int, tuple[float, float]], by_id: dict[int, TraceJob]) -> dict[str, Any]:
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
        "forecast_median_h": round(percentile(forecast_errors, 0.5), 2),
        "forecast_p90_h": round(percentile(forecast_errors, 0.9), 2),
        "naive_median_h": round(percentile(naive_errors, 0.5), 2),
        "naive_p90_h": round(percentile(naive_errors, 0.9), 2),
    }


def advance(state: SimState, start: float, end: float) -> None:
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def metrics(
    jobs: list[TraceJob],
    finished: dict[int, float],
    dropped: int,
    state: SimState,
    capacity: int,
    passes: tuple[list[float], list[float]],
) -> dict[str, Any]:
    pass_ms, pass_cpu_ms = passes
    wait = [j.waited for j in jobs]
    first_wait = [j.start - j.submit for j in jobs if j.start is not None]
    jct: list[float] = []
    waits: dict[str, list[float]] = defaultdict(list)
    jcts: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        jct.append(finished[j.id] - j.submit)
        waits[j.user].append(j.waited)
        jcts[j.user].append(jct[-1])
    per_user_jct = [sum(times) / len(times) for times in jcts.values()]

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
        "user_avg_jct_s": round(sum(per_user_jct) / len(per_user_jct), 1) if per_user_jct else 0.0,
        "p50_jct_s": round(percentile(jct, 0.5), 1),
        "p95_jct_s": round(percentile(jct, 0.95), 1),
        "avg_wait_s": round(sum(wait) / len(wait), 1) if wait else 0.0,
        "p95_wait_s": round(percentile(wait, 0.95), 1),
        "p99_wait_s": round(percentile(wait, 0.99), 1),
        "max_wait_s": round(max(wait, default=0.0), 1),
        "max_first_wait_s": round(max(first_wait, default=0.0), 1),
        "makespan_s": round(makespan, 1),
        "utilization": round(state.busy_gpu_s / (capacity * makespan), 4) if makespan else 0.0,
        "fragmentation": round(state.idle_while_waiting_gpu_s / (capacity * state.waiting_s), 4)
        if state.waiting_s
        else 0.0,
        "shared_jobs": sum(1 for j in jobs if j.fraction < 1),
        "jain_fairness": round(jain, 4),
        "avg_pass_ms": round(sum(pass_ms) / len(pass_ms), 3) if pass_ms else 0.0,
        "p99_pass_ms": round(percentile(pass_ms, 0.99), 3),
        "max_pass_ms": round(max(pass_ms, default=0.0), 3),
        "p99_pass_cpu_ms": round(percentile(pass_cpu_ms, 0.99), 3),
        "max_pass_cpu_ms": round(max(pass_cpu_ms, default=0.0), 3),
        "per_user": {
            user: {
                "jobs": len(waits[user]),
                "avg_jct_s": round(sum(jcts[user]) / len(jcts[user]), 1),
                "p95_wait_s": round(percentile(waits[user], 0.95), 1),
                "p99_wait_s": round(percentile(waits[user], 0.99), 1),
                "gpus_while_waiting": while_waiting(state.gpu_s_while_waiting, user),
                "entitled_while_waiting": while_waiting(state.entitled_gpu_s_while_waiting, user),
            }
            for user in sorted(waits)
        },
        **per_group(state),
    }


def per_group(state: SimState) -> dict[str, Any]:
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
