"""What may change about a job after submission, and by whom: the name and who reads its
outputs always; priority and time limit while it is queued (owner or admin)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from service.core.exceptions import StateConflictError
from service.core.lifecycle import locked_job
from service.core.models import Job, JobState
from service.core.publish import kick_scheduler
from service.core.settings import Settings
from service.jobs.submit import check_session_time_limit
from service.lab.auth import Caller
from towerq.contract.spec import Priority, Visibility, is_notebook


class JobChange(BaseModel):
    """What may change after submission: the name and who reads its outputs always;
    priority and time limit while the job is queued."""

    model_config = {"extra": "forbid"}

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]*$")] | None = None
    priority: Priority | None = None
    time_limit_s: int | None = Field(default=None, ge=1, le=365 * 24 * 3600)
    visibility: Visibility | None = None


def change_job(session: Session, job_id: int, change: JobChange, caller: Caller, settings: Settings) -> Job:
    """Apply `change` to the job under its row lock; the spec keeps the values the job has
    now, so a clone or a resubmit gets them."""
    job = locked_job(session, job_id)
    caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "change")
    if (change.priority is not None or change.time_limit_s is not None) and job.state != JobState.QUEUED:
        raise StateConflictError(f"job {job_id} is {job.state}: priority and time limit change only while queued")
    if change.name is not None:
        job.name = change.name
    if change.priority is not None:
        caller.check_priority(change.priority)
        job.priority = change.priority
        kick_scheduler(session)
    if change.time_limit_s is not None:
        if is_notebook(job.spec):
            check_session_time_limit(caller, change.time_limit_s, settings)
        job.time_limit_s = change.time_limit_s
    job.spec = {**job.spec, **change.model_dump(mode="json", exclude_none=True)}
    session.flush()
    return job
