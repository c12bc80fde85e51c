"""What each job held of the lab's GPUs, and when: the one reading of GPU use that the usage
report, the groups' weekly GPU-hour quotas and the scheduler's fair-share ledger all count
from (before, each read the allocation rows its own way, and only the report counted what a
Slurm cluster ran).

- An allocation row: one GPU, or a fraction of it, from `created_at` to `released_at`
  (None: still held), on the host the row names.
- An attempt an executor's cluster placed (Slurm): it has no allocation rows. It held the
  job's GPUs, whole, as the cluster gives them, from its `running` event to the job's next
  event (its end, or its return to the queue), on the node its `running` event names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.lifecycle import host_of_running
from service.core.models import Allocation, Host, Job, JobEvent, JobState, User, wait_start
from service.scheduler.usage import gpu_hours_within


@dataclass(frozen=True)
class Holding:
    key: tuple[str, int]
    """("allocation", its row's id) or ("cluster", its `running` event's id): one per
    holding, for a reader that folds them in as they end (the fair-share ledger)."""
    job_id: int
    attempt: int
    user: str
    group: str | None
    host: str
    gpus: float
    """A fraction of one GPU for an allocation row; the job's GPUs for a cluster's attempt."""
    start: datetime
    end: datetime | None
    """None: still held."""
    succeeded: bool
    """Its job has succeeded (its run times teach the scheduler how long the owner's jobs run)."""
    submitted: datetime
    """When its job's wait began: its submit, moved later by its time on hold before its
    first start (`wait_start`)."""
    first_start: bool = False
    """A cluster's attempt that is its job's first start (its wait counts); an allocation
    row's job's wait is read from its first allocation (`service.lab.accounting`)."""

    def hours_within(self, since: datetime, until: datetime, now: datetime) -> float:
        return gpu_hours_within(self.gpus, self.start, self.end or now, since, until)


def holdings(session: Session, since: datetime, until: datetime, groups: set[str] | None = None) -> list[Holding]:
    """Every holding that overlaps [since, until], of the jobs in `groups` where that is given."""
    return [*_allocations(session, since, until, groups), *_cluster_attempts(session, since, until, groups)]


def _allocations(session: Session, since: datetime, until: datetime, groups: set[str] | None) -> list[Holding]:
    query = (
        select(
            Allocation.id,
            Allocation.job_id,
            Allocation.attempt,
            User.name,
            Job.group,
            Host.name,
            Allocation.fraction,
            Allocation.created_at,
            Allocation.released_at,
            Job.state,
            Job.created_at,
            Job.wait_held_s,
        )
        .join(Job, Allocation.job_id == Job.id)
        .join(User, Job.user_id == User.id)
        .join(Host, Allocation.host_id == Host.id)
        .where(Allocation.created_at < until)
        .where((Allocation.released_at.is_(None)) | (Allocation.released_at > since))
    )
    if groups is not None:
        query = query.where(Job.group.in_(groups))
    return [
        Holding(
            ("allocation", row_id),
            job_id,
            attempt,
            user,
            group,
            host,
            fraction,
            start,
            end,
            state == JobState.SUCCEEDED,
            wait_start(submitted, held),
        )  # fmt: skip
        for row_id, job_id, attempt, user, group, host, fraction, start, end, state, submitted, held in session.execute(
            query
        )
    ]


def _cluster_attempts(session: Session, since: datetime, until: datetime, groups: set[str] | None) -> list[Holding]:
    """The attempts, overlapping [since, until], of jobs that never held an allocation row
    but ran: each from its `running` event to the job's next event, or still held."""
    allocated = select(Allocation.id).where(Allocation.job_id == Job.id).exists()
    jobs = (
        select(Job.id)
        .where(~allocated, Job.started_at.is_not(None), Job.started_at < until)
        .where((Job.finished_at.is_(None)) | (Job.finished_at > since))
    )
    if groups is not None:
        jobs = jobs.where(Job.group.in_(groups))
    events = session.execute(
        select(
            JobEvent.id,
            JobEvent.job_id,
            JobEvent.attempt,
            JobEvent.state,
            JobEvent.time,
            JobEvent.message,
            User.name,
            Job.group,
            Job.gpu_count,
            Job.state,
            Job.created_at,
            Job.wait_held_s,
        )  # fmt: skip
        .join(Job, JobEvent.job_id == Job.id)
        .join(User, Job.user_id == User.id)
        .where(JobEvent.job_id.in_(jobs))
        .order_by(JobEvent.job_id, JobEvent.id)
    ).all()
    found: list[Holding] = []
    running: Holding | None = None
    started: set[int] = set()
    for event_id, job_id, attempt, state, time, message, user, group, gpus, job_state, submitted, held in events:
        if running is not None:
            if running.job_id == job_id:  # the event after `running` ends that attempt
                running = replace(running, end=time)
            found.append(running)  # else its job has no later event: it is still held
            running = None
        if state == JobState.RUNNING:
            running = Holding(
                ("cluster", event_id), job_id, attempt, user, group, host_of_running(message),
                float(gpus), time, None, job_state == JobState.SUCCEEDED, wait_start(submitted, held),
                job_id not in started,
            )  # fmt: skip
            started.add(job_id)
    if running is not None:
        found.append(running)
    return [h for h in found if h.start < until and (h.end is None or h.end > since)]
