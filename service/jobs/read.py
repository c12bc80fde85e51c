"""Finding and describing jobs: one job, a page of the list, a job's allocation, and what
another member may see of it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session, joinedload

from service.core.exceptions import NotFoundError
from service.core.models import Allocation, Gpu, Host, Job, Notification, User
from service.core.schemas.jobs import (
    AllocationOut,
    HeldOut,
    JobDetailOut,
    JobEventOut,
    JobOut,
    JobPage,
    NotificationOut,
    RankOut,
)
from service.core.sharing import LAB, error_category
from service.lab.auth import Caller
from towerq.contract.spec import is_notebook


def get_job(session: Session, job_id: int) -> Job:
    job = session.scalars(select(Job).options(joinedload(Job.user)).where(Job.id == job_id)).one_or_none()
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    return job


def list_jobs(
    session: Session,
    *,
    states: Sequence[str] = (),
    user: str | None = None,
    text: str | None = None,
    limit: int,
    offset: int,
) -> JobPage:
    query = select(Job)
    if states:
        query = query.where(Job.state.in_(states))
    if user:
        query = query.join(User, Job.user_id == User.id).where(User.name == user)
    if text:
        pattern = f"%{text}%"
        clauses: list[ColumnElement[bool]] = [Job.name.ilike(pattern)]
        if text.isascii() and text.isdigit() and int(text) < 2**63:  # an id ("²" is a digit too)
            clauses.append(Job.id == int(text))
        query = query.where(or_(*clauses))
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    jobs = list(
        session.scalars(query.options(joinedload(Job.user)).order_by(Job.id.desc()).limit(limit).offset(offset))
    )
    allocations = allocations_of(session, jobs)
    return JobPage(
        items=[job_out(job, allocations.get(job.id)) for job in jobs],
        total=total,
        limit=limit,
        offset=offset,
    )


AllocationRow = tuple[int, float, str, int, str, bool, datetime, datetime | None]
"""One GPU an attempt held: attempt, fraction, host, GPU index, GPU UUID, simulated, since,
until."""


def _allocation_rows(session: Session, job_ids: Sequence[int]) -> dict[int, list[AllocationRow]]:
    """Every allocation row of these jobs, by job: by attempt, and within one by rank (the
    order they were given)."""
    rows = session.execute(
        select(
            Allocation.job_id,
            Allocation.attempt,
            Allocation.fraction,
            Host.name,
            Gpu.index,
            Gpu.uuid,
            Gpu.simulated,
            Allocation.created_at,
            Allocation.released_at,
        )
        .join(Gpu, Allocation.gpu_id == Gpu.id)
        .join(Host, Allocation.host_id == Host.id)
        .where(Allocation.job_id.in_(job_ids))
        .order_by(Allocation.job_id, Allocation.attempt, Allocation.id)
    )
    by_job: dict[int, list[AllocationRow]] = defaultdict(list)
    for job_id, attempt, fraction, host, index, uuid, simulated, since, until in rows:
        by_job[job_id].append((attempt, fraction, host, index, uuid, simulated, since, until))
    return by_job


def allocations_of(session: Session, jobs: Sequence[Job]) -> dict[int, AllocationOut]:
    """The allocation of each job's latest attempt (kept after it ends, to show where it ran)."""
    if not jobs:
        return {}
    rows = _allocation_rows(session, [job.id for job in jobs])
    return {job_id: _allocation(held) for job_id, held in rows.items()}


def _allocation(rows: list[AllocationRow]) -> AllocationOut:
    """The allocation of the latest attempt in `rows` (one job's, by attempt)."""
    group = [row for row in rows if row[0] == rows[-1][0]]
    hosts = list(dict.fromkeys(g[2] for g in group))
    first = sorted((g for g in group if g[2] == hosts[0]), key=lambda g: g[3])
    return AllocationOut(
        host=hosts[0],
        gpus=[g[3] for g in first],
        gpu_uuids=[g[4] for g in first],
        fraction=group[0][1],
        simulated=all(g[5] for g in group),
        ranks=[_rank(r, host, group) for r, host in enumerate(hosts)],
    )


def _rank(rank: int, host: str, group: list[AllocationRow]) -> RankOut:
    held = sorted((g for g in group if g[2] == host), key=lambda g: g[3])
    return RankOut(rank=rank, host=host, gpus=[g[3] for g in held], gpu_uuids=[g[4] for g in held])


HIDDEN_URL = "(hidden: only its owner and admins see a webhook URL)"

Shown = TypeVar("Shown", JobOut, JobDetailOut)


def as_seen_by(out: Shown, caller: Caller) -> Shown:
    """A job as `caller` may see it: its folder's path on its host only for admins (a
    member's way to its files is the API's; the path told a member where to aim a job's
    `PATH` at what another job left, tests/security/test_tool_lookup.py); its webhook URLs
    (a Slack hook URL is a secret) only for its owner and admins, and its error's text (the
    trainer's words) only for those who may read its outputs; others read a category
    (`sharing.error_category`)."""
    if caller.is_admin:
        return out
    update: dict[str, Any] = {"artifacts_dir": None} if out.artifacts_dir else {}
    if out.user == caller.name:
        return out.model_copy(update=update) if update else out
    if out.spec.get("notify_url"):
        update["spec"] = {**out.spec, "notify_url": HIDDEN_URL}
    if isinstance(out, JobDetailOut) and any(n.url for n in out.notifications):
        update["notifications"] = [n.model_copy(update={"url": n.url and HIDDEN_URL}) for n in out.notifications]
    if out.spec.get("visibility") != LAB:
        update |= private_error(out)
    return out.model_copy(update=update) if update else out


def private_error(out: JobOut) -> dict[str, Any]:
    """The fields of `out` that carry its error's text, as a member who may not read its
    outputs sees them."""
    update: dict[str, Any] = {}
    if out.error:
        update["error"] = error_category(out.error)
        if out.reason == out.error:
            update["reason"] = update["error"]
    if isinstance(out, JobDetailOut):
        hidden = [e.model_copy(update={"message": error_category(e.message)}) for e in out.events]
        update["events"] = [h if e.state == "failed" else e for e, h in zip(out.events, hidden, strict=True)]
    return update


def job_out(job: Job, allocation: AllocationOut | None) -> JobOut:
    return JobOut.model_validate(job).model_copy(update={"allocation": allocation})


def job_detail(session: Session, job: Job) -> JobDetailOut:
    rows = _allocation_rows(session, [job.id]).get(job.id, [])  # its allocation, and what it held over time
    owed = session.scalars(select(Notification).where(Notification.job_id == job.id).order_by(Notification.id))
    notifications = [NotificationOut.model_validate(n) for n in owed]
    update = {
        "allocation": _allocation(rows) if rows else None,
        "notifications": notifications,
        "url": session_url(job),
        "held": held_by(job, rows),
    }
    return JobDetailOut.model_validate(job).model_copy(update=update)


def held_by(job: Job, rows: Sequence[AllocationRow]) -> list[HeldOut]:
    """The GPUs each of the job's attempts held, and when, from its allocation rows."""
    held: dict[int, HeldOut] = {}
    resumed = job.resumed_steps or {}
    for attempt, _, host, _, _, _, since, until in rows:
        was = held.get(attempt)
        if was is None:
            step = resumed.get(str(attempt), 0)
            start = step if isinstance(step, int) else 0
            held[attempt] = HeldOut(attempt=attempt, host=host, gpus=1, since=since, until=until, from_step=start)
        else:
            was.gpus += 1
            was.since = min(was.since, since)
            was.until = None if was.until is None or until is None else max(was.until, until)
    return list(held.values())


def session_url(job: Job) -> str | None:
    """Where a notebook session's JupyterLab opens (`service.api.routes.sessions`)."""
    return f"/sessions/{job.id}/lab" if is_notebook(job.spec or {}) else None


def job_detail_of_new(job: Job, event: JobEventOut) -> JobDetailOut:
    """The detail of a job just inserted, without asking the database again (`job` is a
    transient row holding what was inserted)."""
    return JobDetailOut.model_validate(job).model_copy(update={"events": [event], "url": session_url(job)})
