"""Queued jobs that may not start yet, and why: those on hold (`towerq hold`), those waiting
for the jobs they name in `after` (a dependency), those whose begin time is ahead (`towerq
run --begin`), those their sweep's `max_parallel` holds back, and those that never can (a
job they need to succeed failed or was cancelled). Each pass leaves the first four out of
the policy's queue and cancels the last (`live`, `handover`); a dry run says the same. The
forecast has those held back by their begin alone arrive then (`forecast.Replay`)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.models import (
    FINAL_STATES,
    HOLDING_STATES,
    UNSUCCESSFUL_STATES,
    Job,
    JobState,
    Sweep,
    User,
    utcnow,
)
from service.scheduler.explain import clock


class HeldBack(NamedTuple):
    waiting: dict[int, str]
    """Queued jobs that may not start yet, with the reason."""
    never: dict[int, str]
    """Queued jobs that never can, with why."""
    begins: dict[int, datetime]
    """Those of `waiting` held back by their begin alone (not on hold, waiting for no job),
    with their begin: the forecast has them arrive then."""


def held_back(session: Session, queued_ids: list[int]) -> HeldBack:
    """Queued jobs that may not start yet, with the reason: those on hold, those waiting for
    the jobs they name in `after`, those whose begin is ahead, then those their sweep's
    `max_parallel` holds back. And the jobs that never can (one they need to succeed failed
    or was cancelled), with why: each pass cancels those, on hold or not."""
    waiting, never = held_by_dependencies(session, queued_ids)
    waiting.update((i, why) for i, why in on_hold(session).items() if i not in never)
    now = utcnow()
    begins = {i: at for i, at in not_begun(session, now).items() if i not in never and i not in waiting}
    waiting.update((i, begin_reason(i, at, now)) for i, at in begins.items())
    free = [i for i in queued_ids if i not in waiting and i not in never]
    return HeldBack({**waiting, **held_by_sweeps(session, free)}, never, begins)


def on_hold(session: Session) -> dict[int, str]:
    """The queued jobs on hold, with why they wait (`hold_reason`); one small query."""
    rows = session.execute(
        select(Job.id, Job.on_hold_by, User.name)
        .join(User, Job.user_id == User.id)
        .where(Job.state == JobState.QUEUED, Job.on_hold_by.is_not(None))
    ).all()
    return {job_id: hold_reason(job_id, holder or "", owner) for job_id, holder, owner in rows}


def not_begun(session: Session, now: datetime) -> dict[int, datetime]:
    """The queued jobs whose begin time is still ahead at `now` (`service.jobs.begin`), with
    their begin; one small query."""
    rows = session.execute(select(Job.id, Job.begin_at).where(Job.state == JobState.QUEUED, Job.begin_at > now)).all()
    return {job_id: begin_at for job_id, begin_at in rows if begin_at is not None}


def begin_reason(job_id: int, begin_at: datetime, now: datetime) -> str:
    """`not before 22:00 (its begin time: towerq update 12 --begin now lets it start)`."""
    when = clock(begin_at.timestamp(), now.timestamp())
    return f"not before {when} (its begin time: towerq update {job_id} --begin now lets it start)"


def hold_reason(job_id: int, holder: str, owner: str) -> str:
    """`on hold (alice): towerq release 12 lets it start`; an admin's hold on another's job
    says that only an admin releases it."""
    if holder != owner:
        return f"on hold by an admin ({holder}): only an admin may release it"
    return f"on hold ({holder}): towerq release {job_id} lets it start"


def held_by_dependencies(session: Session, queued_ids: list[int]) -> tuple[dict[int, str], dict[int, str]]:
    """(job id -> why it waits, job id -> why it can never start) for the queued jobs that
    name others in `after`."""
    rows = session.execute(
        select(Job.id, Job.after_jobs, Job.after_condition).where(
            Job.id.in_(queued_ids), Job.after_condition.is_not(None)
        )
    ).all()
    if not rows:
        return {}, {}
    needed = {d for _, after, _ in rows for d in after or ()}
    states = dict(session.execute(select(Job.id, Job.state).where(Job.id.in_(needed))).all())
    waiting: dict[int, str] = {}
    never: dict[int, str] = {}
    for job_id, after, condition in rows:
        after = after or []
        if condition == "afterok":
            lost = next((d for d in after if states.get(d) in UNSUCCESSFUL_STATES), None)
            if lost is not None:
                never[job_id] = f"job {lost}, which it waits for, {states[lost]}: it could never start (afterok)"
                continue
        if reason := dependency_wait(after, condition, states):
            waiting[job_id] = reason
    return waiting, never


def dependency_wait(after: list[int], condition: str, states: dict[int, str]) -> str | None:
    """Why a job that names `after` (with `condition`) waits, given those jobs' `states`;
    None when none of them holds it."""
    pending = [d for d in after if d in states and JobState(states[d]) not in FINAL_STATES]
    if not pending:
        return None
    more = f" (and {len(pending) - 1} more)" if len(pending) > 1 else ""
    to = "succeed" if condition == "afterok" else "end"
    return f"waiting for job {pending[0]} to {to}{more}"


def held_by_sweeps(session: Session, queued_ids: list[int]) -> dict[int, str]:
    """Queued jobs that must wait because their sweep has `max_parallel` jobs on GPUs
    already: job id -> the reason."""
    rows = session.execute(
        select(Job.id, Job.sweep_id).where(Job.id.in_(queued_ids), Job.sweep_id.is_not(None)).order_by(Job.id)
    ).all()
    if not rows:
        return {}
    sweep_ids = {sweep_id for _, sweep_id in rows}
    limits = {
        sweep.id: sweep.spec.get("max_parallel")
        for sweep in session.scalars(select(Sweep).where(Sweep.id.in_(sweep_ids)))
    }
    active = dict(
        session.execute(
            select(Job.sweep_id, func.count(Job.id))
            .where(Job.sweep_id.in_(sweep_ids), Job.state.in_(HOLDING_STATES))
            .group_by(Job.sweep_id)
        ).all()
    )
    held: dict[int, str] = {}
    admitted: dict[int, int] = {}
    for job_id, sweep_id in rows:
        limit = limits.get(sweep_id) if sweep_id is not None else None
        if limit is None or sweep_id is None:
            continue
        if active.get(sweep_id, 0) + admitted.get(sweep_id, 0) >= limit:
            held[job_id] = f"sweep {sweep_id} runs at most {limit} of its jobs at once"
        else:
            admitted[sweep_id] = admitted.get(sweep_id, 0) + 1
    return held
