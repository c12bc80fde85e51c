"""What if: the lab's own finished jobs as a trace, replayed under its settings and under
another (time slicing off or another slice, more or fewer GPUs, another policy), side by
side, before an admin changes anything.

Each job that ran and ended in the window becomes a trace job: submitted when it was, for
the GPU time it held (every attempt's, summed: what the job needed), on its GPU count and
memory fraction, owned by its user, in its group, with its time limit. Jobs that never ran
(cancelled while queued) and attempts a cluster executor placed (no allocation rows) are
left out and counted. The lab is replayed as `hosts` hosts of `gpus_per_host` GPUs: by
default its hosts now, each as large as its largest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.models import FINAL_STATES, Allocation, Gpu, Group, Host, HostState, Job, User
from service.core.settings import Settings
from service.scheduler.dryrun import policy_config
from service.scheduler.simulate import simulate
from service.scheduler.trace import TraceJob
from service.scheduler.types import Policy, PolicyConfig

MAX_JOBS = 50_000
"""The most jobs one replay takes (the newest are left out beyond it, and counted)."""


@dataclass(frozen=True)
class Setup:
    """What a replay runs on: the lab's shape and its policy's settings."""

    hosts: int
    gpus_per_host: int
    policy: Policy = Policy.TOWERQ
    time_slice_gpu_s: float = 3600.0
    elastic: float = 0.0
    """The share of the jobs on 2 to one host's GPUs replayed as elastic (`simulate`)."""


@dataclass
class LabTrace:
    jobs: list[TraceJob]
    never_ran: int
    """Jobs of the window that ended without holding a GPU (cancelled while queued, or run
    by a cluster executor): not replayed."""
    beyond: int
    """Jobs past MAX_JOBS: not replayed."""


def lab_trace(session: Session, since: datetime, until: datetime) -> LabTrace:
    """The jobs submitted in [since, until] that have ended, as a trace (times from `since`)."""
    held = (
        select(
            Allocation.job_id,
            Allocation.attempt,
            func.min(Allocation.created_at).label("start"),
            func.max(Allocation.released_at).label("end"),
        )
        .group_by(Allocation.job_id, Allocation.attempt)
        .subquery()
    )
    ended_in_window = (Job.created_at >= since, Job.created_at <= until, Job.state.in_(tuple(FINAL_STATES)))
    run_s: dict[int, float] = defaultdict(float)
    for job_id, start, end in session.execute(
        select(held.c.job_id, held.c.start, held.c.end).join(Job, Job.id == held.c.job_id).where(*ended_in_window)
    ):
        if end is not None:
            run_s[job_id] += max(0.0, (end - start).total_seconds())
    rows = session.execute(
        select(Job.id, Job.created_at, Job.gpu_count, Job.gpu_memory_fraction, Job.time_limit_s, Job.group, User.name)
        .join(User, Job.user_id == User.id)
        .where(*ended_in_window)
        .order_by(Job.created_at, Job.id)
    ).all()
    jobs: list[TraceJob] = []
    never_ran = beyond = 0
    for job_id, created_at, gpus, fraction, limit_s, group, user in rows:
        if job_id not in run_s:
            never_ran += 1
            continue
        if len(jobs) >= MAX_JOBS:
            beyond += 1
            continue
        job = TraceJob(len(jobs), (created_at - since).total_seconds(), run_s[job_id], gpus, user)
        job.fraction = fraction if gpus == 1 else 1.0  # the simulator shares one-GPU jobs only
        job.limit = float(limit_s) if limit_s is not None else None
        job.group = group
        jobs.append(job)
    return LabTrace(jobs, never_ran, beyond)


def lab_setup(session: Session, settings: Settings) -> Setup:
    """The lab as it is now: its hosts that are up, each as large as the largest, and the
    service's policy settings."""
    sizes = session.execute(
        select(Host.name, func.count(Gpu.id))
        .join(Gpu, Gpu.host_id == Host.id)
        .where(Host.state == HostState.UP, Gpu.present.is_(True))
        .group_by(Host.name)
    ).all()
    return Setup(
        hosts=max(1, len(sizes)),
        gpus_per_host=max((count for _, count in sizes), default=1),
        time_slice_gpu_s=settings.time_slice_gpu_s,
    )


def group_shares(session: Session) -> dict[str, float]:
    return {name: share for name, share in session.execute(select(Group.name, Group.share))}


def replay(
    trace: LabTrace, setup: Setup, settings: Settings, shares: dict[str, float], hours: dict[str, float]
) -> dict[str, Any]:
    """One replay's figures: the simulator's, plus each user's GPU hours of work (`hours`)."""
    config: PolicyConfig = replace(policy_config(settings), demote_after_gpu_s=setup.time_slice_gpu_s)
    jobs = [replace(job) for job in trace.jobs]  # the simulator consumes its jobs
    result = simulate(
        jobs,
        setup.hosts,
        setup.gpus_per_host,
        setup.policy,
        half_life_s=settings.fair_share_half_life_s,
        config=config,
        group_shares=shares,
        elastic=setup.elastic,
    )
    for user, row in result["per_user"].items():
        row["gpu_hours"] = round(hours[user], 2)
    result["gpu_hours"] = round(sum(hours.values()), 2)
    result["setup"] = setup.__dict__ | {"policy": setup.policy.value}
    return result


def what_if(
    session: Session, settings: Settings, since: datetime, until: datetime, changes: dict[str, Any]
) -> dict[str, Any]:
    """The window's jobs replayed on the lab as it is (`now`) and with `changes` (any of
    Setup's fields), side by side."""
    trace = lab_trace(session, since, until)
    now = lab_setup(session, settings)
    other = replace(now, **changes)
    shares = group_shares(session)
    hours: dict[str, float] = defaultdict(float)  # the same work on either side
    for job in trace.jobs:
        hours[job.user] += job.gpu_count * job.fraction * job.duration / 3600
    return {
        "since": since,
        "until": until,
        "jobs": len(trace.jobs),
        "never_ran": trace.never_ran,
        "beyond_limit": trace.beyond,
        "now": replay(trace, now, settings, shares, hours),
        "what_if": replay(trace, other, settings, shares, hours),
    }
