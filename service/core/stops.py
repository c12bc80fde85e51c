"""The stops towerq asks of an attempt (`AttemptStatus.stop`, which every rank of it reads
each second), and how an attempt's crash is read once one was asked: a member's program
over several hosts may see its peers stop, and end, before its own worker reads the stop.

In order, the first that holds being the one asked (and the one a crash is read as): a
cancel (or an adaptive sweep's stop), the job's time limit reached since the attempt started
running (counted by the database's clock for every rank alike: each rank counting from its
own start, one would stop first), a preemption, and the lab's idle stop of a job over
several hosts (`service.core.gpu_use`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.core.gpu_use import idle_stop_reason
from service.core.lifecycle import PREEMPTED, stopped_early
from service.core.models import Job, JobEvent, JobState, utcnow
from towerq.contract.attempts import Stop, time_limit_text

CRASH_ENDS_AS: dict[Stop, JobState] = {
    "sweep": JobState.SUCCEEDED,
    "time_limit": JobState.FAILED,
    "preempt": JobState.QUEUED,
    "gpu_idle": JobState.FAILED,
}
"""What an attempt asked each stop ends as when it ends with a crash (a cancel: cancelled,
which `requeue` keeps)."""


def asked_stop(
    session: Session, job_id: int, attempt: int, row: Any, idle_stop_s: float
) -> tuple[Stop | None, str | None]:
    """The stop asked of the current attempt, and why in words (`row`: the job's state,
    cancel and preemption asked, stop reason, time limit and GPU use)."""
    return next(_stops(session, job_id, attempt, row, idle_stop_s), (None, None))


def crash_as_stop(session: Session, job: Job, attempt: int, idle_stop_s: float) -> tuple[JobState, str] | None:
    """What an attempt that ended with a crash ends as, where a stop every rank reads was
    asked (None: a crash, or a cancel, which `requeue` keeps): the stop the attempt was
    asked (`CRASH_ENDS_AS`), none counted as a crash. With the reason."""
    stop, reason = next(_stops(session, job.id, attempt, job, idle_stop_s), (None, ""))
    if stop is None or stop == "cancel":
        return None
    if stop == "time_limit":
        reason += f" at step {job.step}" if job.step is not None else " before its first step"
    return CRASH_ENDS_AS[stop], reason


def _stops(session: Session, job_id: int, attempt: int, row: Any, idle_stop_s: float) -> Iterator[tuple[Stop, str]]:
    """The stops that hold for the attempt, in the order they are asked (each checked only
    once those before it are found not to hold)."""
    if row.cancel_requested_at is not None:
        yield ("sweep" if stopped_early(row.stop_reason) else "cancel"), row.stop_reason or "cancelled"
    if row.time_limit_s and row.state == JobState.RUNNING and ran_out(session, job_id, attempt, row.time_limit_s):
        yield "time_limit", time_limit_text(row.time_limit_s)
    if row.preempt_requested_at is not None:
        yield "preempt", row.stop_reason or PREEMPTED
    if idle_stop_s and (idle := idle_stop_reason(session, job_id, attempt, row.gpu_use, idle_stop_s)):
        yield "gpu_idle", idle


def ran_out(session: Session, job_id: int, attempt: int, limit_s: int) -> bool:
    """The attempt has run `limit_s` since it started running (its `running` event; the
    time rank 0's worker counts its limit from)."""
    since = session.scalar(
        select(func.max(JobEvent.time)).where(
            JobEvent.job_id == job_id, JobEvent.attempt == attempt, JobEvent.state == JobState.RUNNING
        )
    )
    return since is not None and (utcnow() - since).total_seconds() >= limit_s
