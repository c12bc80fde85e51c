"""A queued job put on hold and released (`POST /api/jobs/{id}/hold` and `/release`;
`towerq hold`, `towerq release`, as Slurm's `scontrol hold` and `release`). On hold, it
stays queued but every pass leaves it out (`service.scheduler.holdbacks.on_hold`), and its
reason says who holds it. Its owner or an admin holds it; its holder or an admin releases
it, so a member cannot undo an admin's hold on their job. The time on hold is not counted
as waiting (`Job.held_s`): a job held for a week does not come back first in line; nor,
held before its first start, in the wait figures (`Job.wait_held_s`)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.core.exceptions import ForbiddenError, StateConflictError
from service.core.lifecycle import locked_job, record_state
from service.core.models import Job, JobState, utcnow
from service.core.publish import kick_scheduler
from service.lab.auth import Caller
from service.scheduler.holdbacks import hold_reason


def hold_job(session: Session, job_id: int, caller: Caller) -> Job:
    """Put the queued job on hold (again: nothing changes, but that an admin's hold takes
    the place of its owner's)."""
    job = locked_job(session, job_id)
    caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "hold")
    if job.state != JobState.QUEUED:
        stop = "" if JobState(job.state).is_final else " (towerq cancel stops it)"
        raise StateConflictError(f"job {job_id} is {job.state}: only a queued job is put on hold{stop}")
    owner = job.user.name
    if job.on_hold_by is not None and not (job.on_hold_by == owner and caller.name != owner):
        return job  # on hold already, and not an admin's hold taking an owner's place
    if job.on_hold_by is None:
        job.on_hold_at = utcnow()
    job.on_hold_by = caller.name
    job.queue_position = job.reserved_start_at = job.expected_start_at = job.expected_host = None
    job.pending_reason = hold_reason(job.id, caller.name, owner)
    record_state(session, job, JobState.QUEUED, f"put on hold by {caller.name}")
    return job


def release_job(session: Session, job_id: int, caller: Caller) -> Job:
    """Take the job off hold: the next pass places it as if it had waited only while it
    was not on hold."""
    job = locked_job(session, job_id)
    caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "release")
    if job.state != JobState.QUEUED or job.on_hold_by is None or job.on_hold_at is None:
        now = "" if job.state == JobState.QUEUED else f": it is {job.state}"
        raise StateConflictError(f"job {job_id} is not on hold{now}")
    if job.on_hold_by != caller.name and not caller.is_admin:
        by = job.on_hold_by
        raise ForbiddenError(f"job {job_id} was put on hold by {by}, an admin: only an admin may release it")
    held = max(0.0, (utcnow() - job.on_hold_at).total_seconds())
    job.held_s += held
    if job.attempts <= 1:  # never dispatched: a job back in the queue is on a later attempt
        job.wait_held_s += held
    job.on_hold_by = job.on_hold_at = None
    job.pending_reason = None
    record_state(session, job, JobState.QUEUED, f"released by {caller.name}")
    kick_scheduler(session)
    return job
