"""A job that may not start before a time (`"begin_at"` in its spec, `towerq run --begin
22:00`, as Slurm's `sbatch --begin`): it stays queued and every pass leaves it out until
then (`service.scheduler.holdbacks.not_begun`), its reason saying when. The time from its
submit to its begin is no wait, as a hold's is: it is in `Job.held_s` (the order) and
`Job.wait_held_s` (the wait figures) from the submit, so nothing else needs to know. A
queued job's begin changes (`PATCH /api/jobs/{id}`, `towerq update --begin`), those two
with it."""

from __future__ import annotations

from datetime import datetime

from service.core.models import Job


def deferred_s(created_at: datetime, begin_at: datetime | None) -> float:
    """The seconds from a job's submit to its begin: none for a begin before the submit."""
    return 0.0 if begin_at is None else max(0.0, (begin_at - created_at).total_seconds())


def set_begin(job: Job, begin_at: datetime | None) -> None:
    """A queued job's begin changed: the time before it, no wait, changes with it."""
    change = deferred_s(job.created_at, begin_at) - deferred_s(job.created_at, job.begin_at)
    job.held_s = max(0.0, job.held_s + change)
    job.wait_held_s = max(0.0, job.wait_held_s + change)
    job.begin_at = begin_at
