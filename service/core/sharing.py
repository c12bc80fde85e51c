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


CATEGORIES = (
    (("time limit",), "time limit reached"),
    (("nan", "non-finite", "infinite"), "the loss became NaN or infinite"),
    (("out of memory", "memory limit", "oom"), "out of memory"),
    (("gave up after",), "crashed too often"),
    (("does not pass validation", "spec"), "its spec is not valid"),
    (("cancel",), "cancelled"),
)


def error_category(error: str | None) -> str | None:
    """What other members may read of a private job's error: a category ("failed: out of
    memory"), never the text, which the job's own code may have written (a private
    dataset's rows, a patient's name)."""
    if not error:
        return error
    lowered = error.lower()
    for words, category in CATEGORIES:
        if any(word in lowered for word in words):
            return f"failed: {category} (the details are its owner's)"
    return "failed: trainer error (the details are its owner's)"
