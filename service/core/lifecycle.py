"""A job's life: every state change goes through here, leaves a `JobEvent` and is published.

States: queued -> dispatched -> running -> succeeded | failed | cancelled; dispatched or
running -> queued again when an attempt is lost (crash, dead host, preemption), with the
attempt count raised. Each attempt is fenced: a worker reporting for an attempt that is no
longer the job's current one changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, exists, insert, select, update
from sqlalchemy.orm import Session

from service.core.exceptions import NotFoundError, StaleAttemptError, StateConflictError
from service.core.models import (
    FINAL_STATES,
    JOB_FINISHED,
    Allocation,
    Gpu,
    Host,
    Job,
    JobEvent,
    JobState,
    Notification,
    Sweep,
    utcnow,
)
from service.core.publish import job_message, kick_scheduler
from service.core.schemas.jobs import JobEventOut
from towerq.contract.messages import CancelMessage, PreemptMessage, StateMessage


def runs_on(host: str) -> ColumnElement[bool]:
    """Jobs whose current attempt holds GPUs on `host`: the host a job runs on, or any of the
    hosts of a job over several (`Job.host_name` is rank 0's)."""
    held = (
        select(Allocation.job_id)
        .join(Host, Host.id == Allocation.host_id)
        .where(Host.name == host, Allocation.released_at.is_(None), Allocation.attempt == Job.attempts)
    )
    return (Job.host_name == host) | Job.id.in_(held)


def record_state(session: Session, job: Job, state: JobState, message: str | None = None) -> JobEvent:
    """Move `job` to `state`, leaving an event with the time and the reason."""
    now = utcnow()
    job.state = state
    job.updated_at = now
    event = JobEvent(job_id=job.id, time=now, state=state, attempt=job.attempts, message=message)
    session.add(event)
    if state in FINAL_STATES:
        owe_notifications(session, job)
    job_message(session, StateMessage(job_id=job.id, state=str(state), attempt=job.attempts, message=message, time=now))
    return event


def record_new_job(session: Session, job_id: int, message: str) -> JobEventOut:
    """The `queued` event of a job just inserted (without loading its row)."""
    now = utcnow()
    session.execute(
        insert(JobEvent).values(job_id=job_id, time=now, state=JobState.QUEUED.value, attempt=1, message=message)
    )
    job_message(session, StateMessage(job_id=job_id, state="queued", attempt=1, message=message, time=now))
    return JobEventOut(time=now, state=JobState.QUEUED.value, attempt=1, message=message)


def locked_job(session: Session, job_id: int) -> Job:
    """The job row, locked for this transaction (a no-op lock on SQLite's single writer)."""
    job = session.scalars(select(Job).where(Job.id == job_id).with_for_update()).one_or_none()
    if job is None:
        raise NotFoundError(f"job {job_id} not found")
    return job


def current_attempt(session: Session, job_id: int, attempt: int) -> Job:
    """The locked job if `attempt` is still its current attempt; else `StaleAttemptError`."""
    job = locked_job(session, job_id)
    if job.attempts != attempt or not JobState(job.state).holds_gpus:
        raise StaleAttemptError(f"job {job_id} attempt {attempt} is stale (job is {job.state}, attempt {job.attempts})")
    return job


def last_run_attempt(session: Session, job_id: int, attempt: int) -> Job | None:
    """The locked job if `attempt` has ended and is still the last attempt it ran: the job
    ended with it, or waits in the queue for its next (which has not started). Else None."""
    job = locked_job(session, job_id)
    ended = job.attempts == attempt and JobState(job.state).is_final
    waits = job.attempts == attempt + 1 and job.state == JobState.QUEUED
    return job if ended or waits else None


def attempt_fate(session: Session, job_id: int, attempt: int) -> str:
    """What became of a job since its attempt `attempt` (for a disk image that attempt left,
    `worker.disk.settle`): "superseded" (a later attempt has started running, on any host),
    "ended" (a final state, or no such job), else "waits" (it runs again)."""
    later = exists().where(JobEvent.job_id == job_id, JobEvent.state == JobState.RUNNING, JobEvent.attempt > attempt)
    if session.scalar(select(later)):
        return "superseded"
    state = session.scalar(select(Job.state).where(Job.id == job_id))
    return "ended" if state is None or JobState(state).is_final else "waits"


def dispatch(session: Session, job: Job, host_name: str, gpus: Sequence[Gpu], fraction: float) -> None:
    """Give `gpus` to the job's current attempt and mark it dispatched."""
    for gpu in gpus:
        session.add(
            Allocation(job_id=job.id, attempt=job.attempts, host_id=gpu.host_id, gpu_id=gpu.id, fraction=fraction)
        )
    job.host_name = host_name
    job.queue_position = None
    job.pending_reason = None
    job.reserved_start_at = None
    job.expected_start_at = None
    job.expected_host = None
    job.resize_to = None
    hosts: dict[int, list[str]] = {}
    for gpu in gpus:
        hosts.setdefault(gpu.host_id, []).append(str(gpu.index))
    if len(hosts) == 1:
        size = f" ({len(gpus)} of {job.gpu_count} GPUs, elastic)" if len(gpus) != job.gpu_count else ""
        record_state(session, job, JobState.DISPATCHED, f"{gpu_list(hosts[gpus[0].host_id])} on {host_name}{size}")
        return
    names = {gpu.host_id: gpu.host.name for gpu in gpus}
    where = "; ".join(f"rank {r}: {gpu_list(ids)} on {names[h]}" for r, (h, ids) in enumerate(hosts.items()))
    record_state(session, job, JobState.DISPATCHED, f"over {len(hosts)} hosts ({where})")


def hand_over(session: Session, job: Job, executor: str) -> None:
    """Give the job's current attempt to an executor whose cluster places it itself
    (Slurm): no GPUs are allocated here; the node is named when the attempt starts."""
    job.host_name = None
    job.queue_position = None
    job.pending_reason = f"handed to {executor}"
    job.reserved_start_at = None
    job.expected_start_at = None
    job.expected_host = None
    record_state(session, job, JobState.DISPATCHED, f"handed to {executor}")


def mark_running(session: Session, job_id: int, attempt: int, started: dict[str, Any]) -> Job:
    """The worker started the trainer for this attempt: record what it saw."""
    job = current_attempt(session, job_id, attempt)
    if job.state != JobState.DISPATCHED:
        raise StaleAttemptError(f"job {job_id} attempt {attempt} is already {job.state}")
    job.pid = started.get("pid")
    job.cuda_visible_devices = started.get("cuda_visible_devices")
    job.artifacts_dir = started.get("artifacts_dir")
    if job.on_hold_by is not None:  # held in Slurm, and released there by its admin
        off_hold(job)
    if job.started_at is None:
        job.started_at = utcnow()
    record_state(session, job, JobState.RUNNING, running_message(job.pid, job.host_name))
    return job


def running_message(pid: int | None, host: str | None) -> str:
    """The `running` event's message: where the attempt runs (`host_of_running` reads it)."""
    return f"pid {pid} on {host}"


def host_of_running(message: str | None) -> str:
    """The host a `running` event names (the usage report's host for an attempt that held
    no allocation rows: one an executor's cluster placed)."""
    return (message or "").rpartition(" on ")[2] or "?"


def finish(
    session: Session,
    job_id: int,
    attempt: int,
    state: JobState,
    error: str | None = None,
    exit_code: int | None = None,
) -> Job:
    """End this attempt with a final state and free its GPUs. The state's event says
    `error`; a job that succeeded keeps none (what was said is why it ended: a notebook
    session's "idle for N min")."""
    job = current_attempt(session, job_id, attempt)
    release_allocations(session, job)
    job.error = None if state == JobState.SUCCEEDED else error
    job.exit_code = exit_code
    job.finished_at = utcnow()
    job.pid = None
    job.on_hold_by = job.on_hold_at = None  # a job Slurm held pending, cancelled there
    record_state(session, job, state, error)
    kick_scheduler(session)
    return job


def gpu_list(indices: list[str]) -> str:
    """`GPU 0` or `GPUs 0,1`."""
    return f"GPU{'s' if len(indices) != 1 else ''} {','.join(indices)}"


def requeue(session: Session, job: Job, reason: str, crashed: bool) -> None:
    """The current attempt ended early: free its GPUs and queue the next attempt. A crash
    (dead host or worker) counts against `max_attempts`, and the job fails when it has
    crashed that often; a planned stop (worker shutdown, preemption) does not count."""
    release_allocations(session, job)
    job.pid = None
    job.preempt_requested_at = None
    job.stop_reason = None
    if crashed:
        job.crashes += 1
    if job.cancel_requested_at is not None:
        job.finished_at = utcnow()
        record_state(session, job, JobState.CANCELLED, f"cancelled; {reason}")
    elif job.crashes >= job.max_attempts:
        job.error = f"{reason}; gave up after {job.crashes} crashed attempts"
        job.finished_at = utcnow()
        record_state(session, job, JobState.FAILED, job.error)
    else:
        job.attempts += 1
        record_state(session, job, JobState.QUEUED, reason)
    kick_scheduler(session)


def off_hold(job: Job) -> None:
    """The job is on hold no more: its time on hold is counted as no wait (`held_s`, and
    before its first start `wait_held_s`), but for what came before its begin, counted so
    from its submit (`service.jobs.begin`)."""
    if job.on_hold_at is not None:
        since = job.on_hold_at if job.begin_at is None else max(job.on_hold_at, job.begin_at)
        held = max(0.0, (utcnow() - since).total_seconds())  # before its begin it was no wait already
        job.held_s += held
        if job.attempts <= 1 and job.started_at is None:  # a job back in the queue is on a later attempt
            job.wait_held_s += held
    job.on_hold_by = job.on_hold_at = None
    job.pending_reason = None


STOPPED_EARLY = "stopped early by sweep"
"""How the reason of a setting an adaptive sweep stopped begins (`service.jobs.asha`): its
worker ends it succeeded, not cancelled. Only towerq writes a reason (a member's cancel
says "cancelled by NAME")."""


def stopped_early(reason: str | None) -> bool:
    return reason is not None and reason.startswith(STOPPED_EARLY)


def request_cancel(session: Session, job: Job, by: str, reason: str | None = None) -> CancelMessage | None:
    """Cancel a queued job now; ask the worker to stop a dispatched or running one. The job
    ends saying `reason` (default: who cancelled it)."""
    state = JobState(job.state)
    if state.is_final:
        raise StateConflictError(f"job {job.id} is already {state}")
    if state == JobState.QUEUED:
        cancel_queued(session, job, reason or f"cancelled by {by} while queued")
        return None
    if job.cancel_requested_at is not None:
        return None
    job.cancel_requested_at = utcnow()
    job.stop_reason = (reason or f"cancelled by {by}")[:512]
    message = CancelMessage(job_id=job.id, attempt=job.attempts, host=job.host_name, by=by)
    job_message(session, message)
    return message  # for the executor, once this commits (`Executor.stop`)


def cancel_queued(session: Session, job: Job, reason: str) -> None:
    """Cancel a job that waits in the queue, saying why (a person, or a dependency that
    failed)."""
    job.finished_at = utcnow()
    job.cancel_requested_at = job.finished_at
    job.queue_position = None
    job.pending_reason = None
    job.on_hold_by = job.on_hold_at = None  # a hold is a queued job's
    job.stop_reason = reason[:512]
    record_state(session, job, JobState.CANCELLED, job.stop_reason)
    kick_scheduler(session)


PREEMPTED = "stopped to make room for another job; it resumes from its checkpoint"
"""A preemption's reason where it was asked without one (the scheduler says for which job)."""


def request_preemption(session: Session, job: Job, reason: str) -> PreemptMessage | None:
    """Ask the worker to checkpoint this job and put it back in the queue, to make room;
    `reason` becomes the message of its return to the queue. The message returned is for
    the executor once this commits (`Executor.stop`); None when nothing is to stop."""
    if job.preempt_requested_at is not None or not JobState(job.state).holds_gpus:
        return None
    job.preempt_requested_at = utcnow()
    job.stop_reason = reason[:512]
    message = PreemptMessage(job_id=job.id, attempt=job.attempts, host=job.host_name, reason=reason)
    job_message(session, message)
    return message


def release_allocations(session: Session, job: Job) -> None:
    """The current attempt ended: free the GPUs of the job's active allocations (the
    scheduler counts their use), and its remote side's token ends with it."""
    job.attempt_token_hash = None
    session.execute(
        update(Allocation)
        .where(Allocation.job_id == job.id, Allocation.released_at.is_(None))
        .values(released_at=utcnow())
    )


def owe_notifications(session: Session, job: Job, event: str = JOB_FINISHED) -> None:
    """Queue the notifications of a job that just ended, or of `event` (in the same
    transaction): to the lab's webhook, the job's `notify_url` and its sweep's."""
    session.add(Notification(job_id=job.id, url=None, event=event))  # the lab's webhook, if one is set
    targets = {job.spec.get("notify_url")}
    if job.sweep_id is not None:
        sweep = session.get(Sweep, job.sweep_id)
        if sweep is not None:
            targets.add((sweep.spec or {}).get("notify_url"))
    for url in sorted(t for t in targets if t):
        session.add(Notification(job_id=job.id, url=url, event=event))
