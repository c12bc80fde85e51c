"""Usage and fair share: who used the GPUs, and how the scheduler ranks each user now."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from sqlalchemy import func, select

from service.api.deps import AdminDep, CallerDep, SessionDep, SettingsDep
from service.core.exceptions import SpecError
from service.core.models import Gpu, Job, User, utcnow
from service.core.schemas.usage import FairShareOut, StorageOut, StorageRow, TimelineOut, UsageOut
from service.lab.accounting import BY, fair_share_report, timeline, usage_report
from service.lab.whatif import what_if
from service.scheduler.types import Policy
from service.uploads import code, datasets
from towerq.contract.times import in_utc

router = APIRouter(prefix="/api", tags=["usage"])
DEFAULT_WINDOW = timedelta(days=7)
TIMELINE_WINDOW = timedelta(days=1)


@router.get("/usage", response_model=UsageOut)
def usage(
    session: SessionDep,
    _: CallerDep,
    since: Annotated[datetime | None, Query(description="ISO 8601; default: a week before `until`")] = None,
    until: Annotated[datetime | None, Query(description="ISO 8601; default: now")] = None,
    by: Annotated[str, Query(pattern="^(user|host|group)$", description=" or ".join(BY))] = "user",
) -> UsageOut:
    """GPU hours, jobs, and median / p95 wait (submit to first start) per user, host or
    group in [since, until] (by group, the jobs in none are one row, `(no group)`). Running
    jobs count up to now."""
    now = utcnow()
    since, until = _window(since, until, now)
    rows = usage_report(session, since, until, by, now)
    return UsageOut.model_validate({"since": since, "until": until, "by": by, "rows": [row.__dict__ for row in rows]})


@router.get("/fair-share", response_model=FairShareOut)
def fair_share(session: SessionDep, _: CallerDep, settings: SettingsDep) -> FairShareOut:
    """Each user's decayed usage, share, and the rank term the scheduler's policy gives
    their jobs now (0: used nothing lately; 0.5: used exactly their share; towards 1: more)."""
    now = utcnow()
    users, groups = fair_share_report(session, settings.fair_share_half_life_s, settings.user_gpu_limit, now)
    return FairShareOut(as_of=now, half_life_s=settings.fair_share_half_life_s, users=users, groups=groups)


@router.get("/usage/storage", response_model=StorageOut)
def storage(session: SessionDep, settings: SettingsDep, _: CallerDep) -> StorageOut:
    """What each member's uploads and job folders take, beside their quotas."""
    summed = select(
        User.name,
        func.coalesce(func.sum(Job.folder_bytes), 0),
        func.coalesce(func.sum(Job.log_bytes), 0),
        func.coalesce(func.sum(Job.metric_points), 0),
    ).join(Job.user)
    rows_by_user = session.execute(summed.group_by(User.name))
    held = {name: (int(folder or 0), int(logs), int(points)) for name, folder, logs, points in rows_by_user}
    names = sorted(session.scalars(select(User.name)))
    rows = [
        StorageRow(
            user=name,
            datasets_bytes=datasets.usage(settings.data_dir, name),
            code_bytes=code.usage(settings.code_dir, name),
            job_folders_bytes=held.get(name, (0, 0, 0))[0],
            log_bytes=held.get(name, (0, 0, 0))[1],
            metric_points=held.get(name, (0, 0, 0))[2],
        )
        for name in names
    ]
    return StorageOut(
        datasets_quota_bytes=settings.user_data_quota_bytes,
        code_quota_bytes=settings.user_code_quota_bytes,
        job_folder_max_bytes=settings.job_folder_max_bytes,
        job_log_max_bytes=settings.job_log_max_mb * 2**20,
        users=[row for row in rows if row.datasets_bytes or row.code_bytes or row.job_folders_bytes or row.log_bytes],
    )


@router.get("/usage/timeline", response_model=TimelineOut)
def usage_timeline(
    session: SessionDep,
    _: CallerDep,
    since: Annotated[datetime | None, Query(description="ISO 8601; default: a day before `until`")] = None,
    until: Annotated[datetime | None, Query(description="ISO 8601; default: now")] = None,
) -> TimelineOut:
    """Every GPU allocation overlapping [since, until] (job, user, host, GPU, fraction, start,
    end or null while held), and the queue's length and wait at 200 moments across it."""
    now = utcnow()
    since, until = _window(since, until, now, TIMELINE_WINDOW)
    held, samples = timeline(session, since, until, now)
    return TimelineOut.model_validate(
        {
            "since": since,
            "until": until,
            "now": now,
            "gpus": session.scalar(select(func.count(Gpu.id)).where(Gpu.present)) or 0,
            "allocations": held,
            "queue": samples,
        }
    )


def _window(
    since: datetime | None, until: datetime | None, now: datetime, default: timedelta = DEFAULT_WINDOW
) -> tuple[datetime, datetime]:
    until = _aware(until, "until") if until is not None else now
    since = _aware(since, "since") if since is not None else until - default
    if since >= until:
        raise SpecError("since", f"must be before until ({until.isoformat()})")
    return since, until


def _aware(value: datetime, field: str) -> datetime:
    if value.tzinfo is None:
        raise SpecError(field, "give a time zone (e.g. 2026-11-23T12:00:00Z)")
    try:
        return in_utc(value)
    except ValueError as err:
        raise SpecError(field, str(err)) from None


class WhatIfRequest(BaseModel):
    """A window of the lab's history and the settings to replay it under, beside the lab's
    own; a field left out stays as the lab is."""

    model_config = {"extra": "forbid"}

    since: datetime | None = Field(default=None, description="ISO 8601 with a zone; default: 30 days before until")
    until: datetime | None = Field(default=None, description="default: now")
    hosts: int | None = Field(default=None, ge=1, le=1000)
    gpus_per_host: int | None = Field(default=None, ge=1, le=64)
    policy: Policy | None = None
    time_slice_gpu_s: float | None = Field(default=None, ge=0, le=30 * 86400, description="0: no time slicing")


WHAT_IF_WINDOW = timedelta(days=30)
WHAT_IF_MAX_WINDOW = timedelta(days=92)


@router.post("/usage/what-if")
def usage_what_if(body: WhatIfRequest, session: SessionDep, settings: SettingsDep, _: AdminDep) -> dict[str, Any]:
    """Replay the lab's jobs of a window (submitted in it, ended) on the lab as it is now and
    with the changes asked for, side by side: avg JCT, waits, utilization, per user (admins).
    It takes as long as two `towerq simulate` runs on those jobs (5,000 jobs on 256 GPUs:
    about 10 s)."""
    now = utcnow()
    since, until = _window(body.since, body.until, now, WHAT_IF_WINDOW)
    if until - since > WHAT_IF_MAX_WINDOW:
        raise SpecError("since", f"a what-if replays at most {WHAT_IF_MAX_WINDOW.days} days")
    changes = {
        k: v
        for k, v in body.model_dump(include={"hosts", "gpus_per_host", "policy", "time_slice_gpu_s"}).items()
        if v is not None
    }
    return what_if(session, settings, since, until, changes)
