"""What may change about a job after submission, and by whom: the name and who reads its
outputs always; priority while it is queued; its begin until it first runs; the time limit
until it ends (owner or admin), but once the job has started (dispatched, running) only an
admin lengthens it, as in Slurm: the scheduler placed it by that limit (a reservation, a
backfill) and others' starts count on its end."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from service.core.exceptions import ForbiddenError, SpecError, StateConflictError
from service.core.lifecycle import locked_job, record_state
from service.core.models import Job, JobState
from service.core.publish import kick_scheduler
from service.core.settings import Settings
from service.executors import Executor, ExecutorError
from service.jobs.begin import set_begin
from service.jobs.submit import check_session_time_limit
from service.lab.auth import Caller
from service.scheduler.handover import attempt_of
from towerq.contract.signals import limit_signal
from towerq.contract.spec import NO_CONTROL, Priority, Visibility, is_notebook
from towerq.contract.times import Moment, limit_text


class JobChange(BaseModel):
    """What may change after submission: the name and who reads its outputs always;
    priority while the job is queued; its time limit until it ends."""

    model_config = {"extra": "forbid"}

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=NO_CONTROL)] | None = None
    priority: Priority | None = None
    time_limit_s: int | None = Field(default=None, ge=1, le=365 * 24 * 3600)
    visibility: Visibility | None = None
    begin_at: Moment | None = Field(
        default=None, description="a queued job that never ran: it starts no earlier than this (now: at once)"
    )


def change_job(
    session: Session,
    job_id: int,
    change: JobChange,
    caller: Caller,
    settings: Settings,
    executor: Executor,
) -> Job:
    """Apply `change` to the job under its row lock; the spec keeps the values the job has
    now, so a clone or a resubmit gets them. A started job's new time limit reaches its
    runner within a second (`attempt_status`) and, on Slurm, its Slurm job (`retime`,
    before this commits: 409 where Slurm refuses)."""
    job = locked_job(session, job_id)
    caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "change")
    if change.priority is not None and job.state != JobState.QUEUED:
        raise StateConflictError(f"job {job_id} is {job.state}: its priority changes only while it is queued")
    if change.time_limit_s is not None and JobState(job.state).is_final:
        raise StateConflictError(f"job {job_id} is {job.state}: its time limit no longer changes")
    if change.begin_at is not None:
        if job.state != JobState.QUEUED or job.started_at is not None or job.attempts > 1:
            raise StateConflictError(f"job {job_id} is {job.state}: its begin changes only before it first runs")
        set_begin(job, change.begin_at)
        job.pending_reason = None  # the next pass says it anew
        kick_scheduler(session)
    if change.name is not None:
        job.name = change.name
    if change.priority is not None:
        caller.check_priority(change.priority)
        job.priority = change.priority
        kick_scheduler(session)
    if change.time_limit_s is not None and change.time_limit_s != job.time_limit_s:
        if is_notebook(job.spec):
            check_session_time_limit(caller, change.time_limit_s, settings)
        if job.state == JobState.QUEUED:
            check_signal_lead(job.spec, change.time_limit_s)
            job.time_limit_s = change.time_limit_s
        else:
            retime(session, job, change.time_limit_s, caller, executor)
    job.spec = {**job.spec, **change.model_dump(mode="json", exclude_none=True)}
    session.flush()
    return job


def check_signal_lead(spec: dict[str, Any], limit_s: int) -> None:
    """A queued job's time limit stays longer than its `signal`'s lead, as at submit: else the
    warning would come at the program's start, before it could catch it. A started job's may
    be shortened past it (the warning then goes at once), as to stop it soon."""
    if spec.get("signal") is None:
        return
    name, before = limit_signal(spec["signal"])
    if limit_s <= before:
        raise SpecError(
            "time_limit_s",
            f"{limit_s} s is within the {before} s its signal warns before the time limit ({name}@{before}): "
            "the warning would come at its start",
        )


def retime(session: Session, job: Job, limit_s: int, caller: Caller, executor: Executor) -> None:
    """A started job's new time limit: shorter by its owner or an admin, longer by an admin
    only; its attempt's cluster told (Slurm's own limit follows towerq's). Each attempt has
    the whole limit from its start, this one too: one already past it stops now, after a
    checkpoint."""
    was = job.time_limit_s
    if not caller.is_admin and was is not None and limit_s > was:
        raise ForbiddenError(
            f"job {job.id} is {job.state}: only an admin lengthens a started job's time limit "
            f"({limit_text(was)}); its owner may shorten it"
        )
    job.time_limit_s = limit_s
    try:
        executor.retime(attempt_of(job))
    except ExecutorError as err:
        raise StateConflictError(f"job {job.id}'s time limit could not be changed: {err}") from err
    record_state(
        session, job, JobState(job.state), f"time limit {limit_text(was)} → {limit_text(limit_s)} by {caller.name}"
    )
    kick_scheduler(session)
