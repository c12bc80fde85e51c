"""A job's `after`: the jobs (or whole sweeps) it waits for, checked and resolved to job ids
at submit. The scheduler holds it until they succeed (`afterok`, the default) or end
(`afterany`), and cancels it, saying why, when one it needs to succeed fails or is
cancelled (`service.scheduler.waiting`). Their folders are its inputs (read-only, at
`/inputs/job-<id>` in the sandbox; `worker.launch`)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.exceptions import SpecError
from service.core.models import UNSUCCESSFUL_STATES, Job, Sweep
from service.jobs.privacy import may_read_outputs
from service.lab.auth import Caller
from towerq.contract.spec import JobSpec

MAX_AFTER_JOBS = 2000
"""Jobs one job may wait for once sweeps are resolved (a sweep of 1,000 and then some)."""


def resolve_after(session: Session, caller: Caller, spec: JobSpec) -> list[int] | None:
    """The job ids `spec.after` names (a sweep: all its jobs), each checked: it exists, the
    caller may read its folder (it becomes an input), and, for `afterok`, it has not
    already failed or been cancelled (the job could never start). None: it waits for none."""
    if not spec.after:
        return None
    ids: list[int] = []
    for ref in spec.after:
        if isinstance(ref, int):
            job = session.get(Job, ref)
            if job is None:
                raise SpecError("after", f"job {ref} does not exist")
            jobs = [job]
        else:
            sweep_id = int(ref.partition(":")[2])
            if session.get(Sweep, sweep_id) is None:
                raise SpecError("after", f"sweep {sweep_id} does not exist")
            jobs = list(session.scalars(select(Job).where(Job.sweep_id == sweep_id).order_by(Job.id)))
        for job in jobs:
            if not may_read_outputs(job, caller):
                raise SpecError(
                    "after",
                    f"job {job.id} is {job.user.name}'s and private: its folder would be this job's input "
                    f"(they can share it with `towerq share {job.id}`)",
                )
            if spec.after_condition == "afterok" and job.state in UNSUCCESSFUL_STATES:
                raise SpecError(
                    "after",
                    f"job {job.id} {job.state}: a job after it (afterok) could never start; "
                    "after_condition afterany waits for it to end whatever its state",
                )
            ids.append(job.id)
    unique = sorted(set(ids))
    if len(unique) > MAX_AFTER_JOBS:
        raise SpecError("after", f"{len(unique):,} jobs named (sweeps resolved); at most {MAX_AFTER_JOBS:,}")
    return unique
