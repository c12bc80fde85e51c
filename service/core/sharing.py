"""Whose eyes a job's outputs (its log and artifacts) are for: its owner, the admins, and,
for a job that says `visibility: lab`, every member. The API's privacy rules
(`service.jobs.privacy`) and the workers (a job's dependencies' folders are its inputs) ask
the same question here."""

from __future__ import annotations

from service.core.models import Job

LAB = "lab"


def shares_outputs(job: Job, reader_id: int, reader_is_admin: bool) -> bool:
    """Whether the user `reader_id` may read `job`'s log and artifacts."""
    return reader_is_admin or job.user_id == reader_id or job.spec.get("visibility") == LAB
