"""A queued job put on hold and released (`POST /api/jobs/{id}/hold` and `/release`;
`towerq hold`, `towerq release`, as Slurm's `scontrol hold` and `release`). On hold, it
stays queued but every pass leaves it out (`service.scheduler.holdbacks.on_hold`), and its
reason says who holds it. Its owner or an admin holds it; its holder or an admin releases
it, so a member cannot undo an admin's hold on their job. On Slurm a job handed over and
still pending there (dispatched) is held there too (`scontrol hold`, `Executor.hold`). The
time on hold is not counted as waiting (`Job.held_s`): a job held for a week does not
come back first in line; nor, held before its first start, in the wait figures
(`Job.wait_held_s`)."""

from __future__ import annotations

import logging

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from service.core.exceptions import ForbiddenError, StateConflictError
from service.core.lifecycle import locked_job, off_hold, record_state
from service.core.models import Job, JobState, utcnow
from service.core.publish import kick_scheduler
from service.executors import Attempt, Executor, ExecutorError
from service.lab.auth import Caller
from service.scheduler.handover import attempt_of
from service.scheduler.holdbacks import hold_reason

log = logging.getLogger(__name__)


def hold_job(session: Session, job_id: int, caller: Caller, executor: Executor | None = None) -> Job:
    """Put the queued job on hold (again: nothing changes, but that an admin's hold takes
    the place of its owner's). A job handed to `executor`'s cluster and not started there
    (dispatched, on Slurm) is held there too, before this commits (and released there again
    if this does not commit): 409 where it started."""
    job = locked_job(session, job_id)
    caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "hold")
    handed_over = handed_to_cluster(job, executor)
    if job.state != JobState.QUEUED and handed_over is None:
        stop = "" if JobState(job.state).is_final else " (towerq cancel stops it)"
        raise StateConflictError(f"job {job_id} is {job.state}: only a queued job is put on hold{stop}")
    owner = job.user.name
    if job.on_hold_by is not None and not (job.on_hold_by == owner and caller.name != owner):
        return job  # on hold already, and not an admin's hold taking an owner's place
    if job.on_hold_by is None:
        if handed_over is not None:
            try:
                handed_over.hold(attempt_of(job), True)
            except ExecutorError as err:
                raise StateConflictError(f"job {job_id} could not be put on hold: {err}") from err
            undone_unless_committed(session, job_id, handed_over, attempt_of(job), True)
        job.on_hold_at = utcnow()
    job.on_hold_by = caller.name
    job.queue_position = job.reserved_start_at = job.expected_start_at = job.expected_host = None
    job.pending_reason = hold_reason(job.id, caller.name, owner)
    record_state(session, job, JobState(job.state), f"put on hold by {caller.name}")
    return job


def release_job(session: Session, job_id: int, caller: Caller, executor: Executor | None = None) -> Job:
    """Take the job off hold: the next pass places it as if it had waited only while it
    was not on hold (one held in `executor`'s cluster is released there too)."""
    job = locked_job(session, job_id)
    caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "release")
    if job.state not in (JobState.QUEUED, JobState.DISPATCHED) or job.on_hold_by is None or job.on_hold_at is None:
        now = "" if job.state == JobState.QUEUED else f": it is {job.state}"
        raise StateConflictError(f"job {job_id} is not on hold{now}")
    if job.on_hold_by != caller.name and not caller.is_admin:
        by = job.on_hold_by
        raise ForbiddenError(f"job {job_id} was put on hold by {by}, an admin: only an admin may release it")
    handed_over = handed_to_cluster(job, executor)
    if handed_over is not None:
        try:
            handed_over.hold(attempt_of(job), False)
        except ExecutorError as err:  # its Slurm job is gone: the next pass sees how it ended
            log.warning("job %s: releasing it in %s failed: %s", job_id, handed_over.name, err)
        else:
            undone_unless_committed(session, job_id, handed_over, attempt_of(job), False)
    off_hold(job)
    record_state(session, job, JobState(job.state), f"released by {caller.name}")
    kick_scheduler(session)
    return job


def handed_to_cluster(job: Job, executor: Executor | None) -> Executor | None:
    """`executor`, where `job` waits in its cluster (dispatched where the cluster places
    jobs itself: Slurm) and can be held there; else None."""
    if executor is None or executor.places_jobs or job.state != JobState.DISPATCHED:
        return None
    return executor


def undone_unless_committed(session: Session, job_id: int, executor: Executor, attempt: Attempt, held: bool) -> None:
    """Undo the hold (`held`) or release just asked of the cluster where towerq's own change
    then does not commit (a failed commit, an error later in the request): else a job held in
    Slurm would stay held there while towerq has it off hold, where no `towerq release` can
    reach it (one released there but held here would start, and `mark_running` takes it off
    hold)."""
    committed = False

    def on_commit(_session: Session) -> None:
        nonlocal committed
        committed = True

    def on_rollback(_session: Session, transaction: SessionTransaction) -> None:
        nonlocal committed
        if committed or transaction.parent is not None:  # done, or a savepoint's rollback
            return
        committed = True  # undone once
        what = "hold" if held else "release"
        try:
            executor.hold(attempt, not held)
        except ExecutorError as err:
            log.warning("job %s: undoing its %s in %s failed: %s", job_id, what, executor.name, err)
        else:
            log.warning("job %s: its %s in %s undone: towerq's change did not commit", job_id, what, executor.name)

    event.listen(session, "after_commit", on_commit)
    event.listen(session, "after_soft_rollback", on_rollback)
