"""Usage accounting and the fair-share view: who used the lab's GPUs, and why the scheduler
ranks each user where it does.

- `usage_report`: per user, host or group, over a time window, from what jobs held
  (`service.scheduler.holdings`: allocation rows, and the attempts a Slurm cluster placed):
  GPU hours (the part of each holding inside the window; a running one counts up to now),
  the jobs that held GPUs in the window, and the wait (submit to first start, less any time
  on hold before it: `Job.wait_held_s`) of the jobs that first started in it, median and p95;
  and how busy those GPU hours were, where the jobs' workers sampled their GPUs
  (`Job.gpu_use`: each job's busy share, weighted by its GPU hours in the window).
- `fair_share_report`: each user's decayed usage, share, and the rank term the policy
  gives them now, computed by the policy's own `FairShareTerms` from the same rows and
  estimates a scheduling pass reads (`service.scheduler.snapshot`, the usage ledger).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.models import Allocation, Gpu, Group, Host, Job, User, wait_start
from service.core.models.jobs import gpu_use_summary
from service.core.schemas.usage import FairShareGroupOut, FairShareUserOut, HeldOut, QueueSampleOut
from service.lab.groups import default_groups
from service.scheduler.holdings import holdings
from service.scheduler.ranking import FairShareTerms
from service.scheduler.snapshot import live_inputs

BY = ("user", "host", "group")
NO_GROUP = "(no group)"
"""The key of the jobs that ran in no group, in a report by group (no group has this name)."""


@dataclass
class UsageRow:
    key: str
    gpu_hours: float = 0.0
    jobs: int = 0
    started: int = 0
    """Jobs that first started in the window (their waits are the wait figures)."""
    median_wait_s: float | None = None
    p95_wait_s: float | None = None
    gpu_busy_pct: float | None = None
    """How busy the GPUs were over `sampled_gpu_hours` (None: no job's GPUs were sampled)."""
    sampled_gpu_hours: float = 0.0
    """Of `gpu_hours`, those of jobs whose GPU use was sampled (not simulated GPUs)."""
    job_ids: set[int] = field(default_factory=set, repr=False)
    job_hours: dict[int, float] = field(default_factory=dict, repr=False)
    waits: list[float] = field(default_factory=list, repr=False)


def usage_report(session: Session, since: datetime, until: datetime, by: str, now: datetime) -> list[UsageRow]:
    """Usage per user, host or group in [since, until], most GPU hours first."""
    rows: dict[str, UsageRow] = {}

    def row(name: str | None) -> UsageRow:
        name = NO_GROUP if name is None else name
        return rows.setdefault(name, UsageRow(name))

    for held in holdings(session, since, until):
        entry = row({"user": held.user, "host": held.host, "group": held.group}[by])
        hours = held.hours_within(since, until, now)
        entry.gpu_hours += hours
        entry.job_ids.add(held.job_id)
        entry.job_hours[held.job_id] = entry.job_hours.get(held.job_id, 0.0) + hours
        if held.first_start and since <= held.start <= until:
            entry.waits.append(max(0.0, (held.start - held.submitted).total_seconds()))
    key = {"user": User.name, "host": Host.name, "group": Job.group}[by]
    first = (
        select(Allocation.job_id, func.min(Allocation.created_at).label("started"))
        .group_by(Allocation.job_id)
        .subquery()
    )
    starts = session.execute(
        select(key, Job.created_at, Job.wait_held_s, first.c.started)
        .join(first, first.c.job_id == Job.id)
        .join(User, Job.user_id == User.id)
        .join(Allocation, (Allocation.job_id == Job.id) & (Allocation.created_at == first.c.started))
        .join(Host, Allocation.host_id == Host.id)
        .where(first.c.started >= since, first.c.started <= until)
        .distinct()
    )
    for name, submitted, held, started in starts:
        row(name).waits.append(max(0.0, (started - wait_start(submitted, held)).total_seconds()))
    busy = gpu_busy(session, {job_id for entry in rows.values() for job_id in entry.job_ids})
    for entry in rows.values():
        sampled = {job_id: hours for job_id, hours in entry.job_hours.items() if job_id in busy}
        entry.sampled_gpu_hours = sum(sampled.values())
        if entry.sampled_gpu_hours > 0:
            weighted = sum(hours * busy[job_id] for job_id, hours in sampled.items())
            entry.gpu_busy_pct = round(weighted / entry.sampled_gpu_hours, 1)
        entry.jobs = len(entry.job_ids)
        entry.started = len(entry.waits)
        if entry.waits:
            entry.median_wait_s = statistics.median(entry.waits)
            entry.p95_wait_s = percentile(entry.waits, 95)
    return sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.key))


def gpu_busy(session: Session, job_ids: set[int]) -> dict[int, float]:
    """The busy share of each of these jobs' GPUs that their workers sampled (`Job.gpu_use`)."""
    found: dict[int, float] = {}
    ids = sorted(job_ids)
    for start in range(0, len(ids), 1000):  # within any database's bound on parameters
        chunk = ids[start : start + 1000]
        rows = session.execute(select(Job.id, Job.gpu_use).where(Job.id.in_(chunk), Job.gpu_use.is_not(None)))
        for job_id, stored in rows:
            if (summary := gpu_use_summary(stored)) is not None:
                found[job_id] = summary["busy_pct"]
    return found


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def fair_share_report(
    session: Session, half_life_s: float, default_limit: int | None, now: datetime
) -> tuple[list[FairShareUserOut], list[FairShareGroupOut]]:
    """Every user with usage or jobs (a row per group they have jobs in), and every group,
    as the policy would rank them in a pass now."""
    queued, cluster, fair_share, *_ = live_inputs(session, half_life_s, default_limit, now)
    usage = fair_share.usage
    terms = FairShareTerms(fair_share, cluster.running, queued, now.timestamp())
    running: dict[tuple[str, str | None], float] = defaultdict(float)
    for job in cluster.running:
        running[(job.user, job.group)] += job.gpu_load
    waiting: dict[tuple[str, str | None], int] = defaultdict(int)
    for queued_job in queued:
        waiting[(queued_job.user, queued_job.group)] += 1
    present = set(running) | set(waiting)
    present_users = {user for user, _ in present}
    homes = default_groups(session)  # an idle member shows under the group their next job runs in
    absent: set[tuple[str, str | None]] = {
        (u, homes.get(u)) for u, v in usage.items() if v > 0 and u not in present_users
    }
    users = [
        FairShareUserOut(
            user=user,
            group=group,
            share=fair_share.share(user),
            usage_gpu_hours=usage.get(user, 0.0) / 3600,
            running_gpus=running[(user, group)],
            queued_jobs=waiting[(user, group)],
            owed=terms.owed(user, group) if (user, group) in present else None,
            used=terms.used_part(user, group) if (user, group) in present else None,
            term=terms.term(user, group) if (user, group) in present else None,
        )
        for user, group in sorted(present | absent, key=lambda a: (a[1] or "", a[0]))
    ]
    configured = session.execute(select(Group.name, Group.max_gpus, Group.max_gpu_hours_week)).all()
    if not configured:
        return users, []
    caps = {name: (max_gpus, hours) for name, max_gpus, hours in configured}
    names: set[str | None] = {*caps, *(group for _, group in present | absent)}
    groups = []
    for group in sorted(names, key=lambda g: (g is None, g or "")):
        max_gpus, max_hours = caps.get(group, (None, None)) if group is not None else (None, None)
        hours = fair_share.group_hours.get(group) if group is not None else None
        here = group in terms.members
        groups.append(
            FairShareGroupOut(
                group=group,
                share=fair_share.group_share(group),
                usage_gpu_hours=fair_share.group_usage.get(group, 0.0) / 3600,
                running_gpus=sum(v for (_, g), v in running.items() if g == group),
                queued_jobs=sum(v for (_, g), v in waiting.items() if g == group),
                owed=terms.group_owed(group) if here else None,
                used=terms.group_used_part(group) if here else None,
                term=terms.group_term(group) if here else None,
                max_gpus=max_gpus,
                max_gpu_hours_week=max_hours,
                gpu_hours_week=hours[0] if hours is not None else None,
            )
        )
    return users, groups


TIMELINE_SAMPLES = 200


def timeline(
    session: Session, since: datetime, until: datetime, now: datetime
) -> tuple[list[HeldOut], list[QueueSampleOut]]:
    """Who held which GPU when in [since, until] (each allocation, for a Gantt chart per GPU
    or GPUs per user over time), and the queue's length and wait at 200 moments."""
    held = [
        HeldOut(
            job_id=r.job_id,
            job_name=r.job_name,
            user=r.user,
            host=r.host,
            gpu=r.gpu,
            fraction=r.fraction,
            start=r.created_at,
            end=r.released_at,
            group=r.group,
        )
        for r in session.execute(
            select(
                Allocation.job_id,
                Job.name.label("job_name"),
                User.name.label("user"),
                Host.name.label("host"),
                Gpu.index.label("gpu"),
                Allocation.fraction,
                Allocation.created_at,
                Allocation.released_at,
                Job.group,
            )
            .join(Job, Allocation.job_id == Job.id)
            .join(User, Job.user_id == User.id)
            .join(Host, Allocation.host_id == Host.id)
            .join(Gpu, Allocation.gpu_id == Gpu.id)
            .where(Allocation.created_at < until)
            .where((Allocation.released_at.is_(None)) | (Allocation.released_at > since))
            .order_by(Host.name, Gpu.index, Allocation.created_at)
        )
    ]
    first = (
        select(Allocation.job_id, func.min(Allocation.created_at).label("started"))
        .group_by(Allocation.job_id)
        .subquery()
    )
    # a job's first start: its first allocation, or where a cluster ran it (Slurm: no
    # allocation rows) its first `running`
    started_at = func.coalesce(first.c.started, Job.started_at)
    waits = session.execute(
        select(Job.created_at, Job.finished_at, started_at, Job.wait_held_s)
        .outerjoin(first, first.c.job_id == Job.id)
        .where(Job.created_at < until)
        .where(
            ((started_at.is_(None)) & ((Job.finished_at.is_(None)) | (Job.finished_at > since))) | (started_at > since)
        )
    ).all()
    step = (until - since) / TIMELINE_SAMPLES
    samples = []
    for i in range(TIMELINE_SAMPLES + 1):
        moment = since + step * i
        if moment > now:
            break
        queued = 0
        started = []
        for submitted, finished, start, on_hold in waits:
            end = start or finished or now
            if submitted <= moment < end:
                queued += 1
            if start is not None and moment - step < start <= moment:
                started.append(max(0.0, (start - wait_start(submitted, on_hold)).total_seconds()))
        median = statistics.median(started) if started else None
        samples.append(QueueSampleOut(time=moment, queued=queued, started=len(started), median_wait_s=median))
    return held, samples
