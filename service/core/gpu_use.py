"""A running job's GPU use, as its ranks report it (`towerq.contract.attempts.GpuUse`, kept
in `Job.gpu_use` by attempt and rank), and what towerq decides from it: the `job.idle`
webhook once every rank's GPUs are idle past the lab's warning time, and the stop of a job
over several hosts once they have been idle its stop time (each host's worker sees only its
own GPUs; a one-host job's worker stops it itself: `worker.gpu_use`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from service.core.lifecycle import owe_notifications
from service.core.models import JOB_IDLE, Allocation, Job, JobState, Notification, utcnow
from service.core.models.jobs import idle_since, idle_stop_since
from towerq.contract.attempts import GpuUse, idle_stop_text


def store_gpu_use(session: Session, job: Job, attempt: int, use: GpuUse, idle_warn_s: float) -> None:
    """Keep a rank's GPU use beside the others' (as JSON, by attempt and rank). The report
    that makes the running job idle (every rank of its attempt told that its GPUs are idle)
    owes its webhooks `job.idle`, once for each idle stretch; never where the lab warns of
    none (`idle_warn_s` 0), and never twice within `idle_warn_s`: a stretch lasts that long
    before it is told, so only reports forged on a Slurm node (the supervisor there is the
    member's) could come faster, and they are not let to flood the lab's webhook."""
    running = job.attempts if job.state == JobState.RUNNING else None
    was_idle = idle_since(job.gpu_use, running)
    job.gpu_use = {**(job.gpu_use or {}), f"{attempt}.{use.rank}": use.model_dump(mode="json")}
    if running != attempt or was_idle is not None or not idle_warn_s or not idle_since(job.gpu_use, running):
        return
    last = select(func.max(Notification.created_at)).where(
        Notification.job_id == job.id, Notification.event == JOB_IDLE
    )
    told = session.scalar(last)
    if told is None or (utcnow() - told).total_seconds() >= idle_warn_s:
        owe_notifications(session, job, JOB_IDLE)


def idle_stop_reason(
    session: Session, job_id: int, attempt: int, stored: dict[str, Any] | None, idle_stop_s: float
) -> str | None:
    """Why the attempt of a job over several hosts is stopped, where every rank's figures
    say its GPUs have been idle the lab's `idle_stop_s` (None: a rank's are not, or it runs
    on one host: its worker stops it)."""
    said = sum(key.startswith(f"{attempt}.") for key in stored or {})
    if said < 2 or idle_stop_since(stored, attempt, said) is None:
        return None  # a rank busy, or one rank said at most
    of_attempt = (Allocation.job_id == job_id) & (Allocation.attempt == attempt)
    hosts = session.scalar(select(func.count(distinct(Allocation.host_id))).where(of_attempt)) or 0
    since = idle_stop_since(stored, attempt, hosts) if hosts > 1 else None
    return idle_stop_text((utcnow() - since).total_seconds(), idle_stop_s, hosts) if since is not None else None
