"""Group commit of submissions: one writer thread stores all the jobs waiting at once.

Request threads hand their job rows to the writer and wait; the writer takes every row
waiting (up to `MAX_BATCH`), stores them in one transaction, and answers each request.
One write lock handoff and one commit serve a whole batch, and only one thread per API
process competes for the database's write lock, instead of every request thread (which on
SQLite, with one writer at a time, was the limit on submissions per second).
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.db import Database, insert_ignoring_duplicates
from service.core.lifecycle import record_new_job
from service.core.models import Job
from service.core.publish import kick_scheduler
from service.core.schemas.jobs import JobEventOut

log = logging.getLogger(__name__)

MAX_BATCH = 128


@dataclass
class Submission:
    row: dict[str, Any]
    user: str
    result: Future[tuple[int, JobEventOut | None]] = field(default_factory=Future)
    """(job id, the queued event) for a new job; (job id, None) for an idempotent repeat."""


class SubmissionWriter:
    """Stores submissions in batches; `store` blocks the calling thread until its batch
    has committed."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.waiting: queue.SimpleQueue[Submission] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="submission-writer", daemon=True)
        self.thread.start()

    def store(self, row: dict[str, Any], user: str) -> tuple[int, JobEventOut | None]:
        submission = Submission(row, user)
        self.waiting.put(submission)
        return submission.result.result()

    def _serve(self) -> None:
        while True:
            batch = [self.waiting.get()]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.waiting.get_nowait())
                except queue.Empty:
                    break
            try:
                results = self._write(batch)
            except Exception as err:  # every waiting request gets the error, none hangs
                log.exception("storing %d submissions failed", len(batch))
                for submission in batch:
                    submission.result.set_exception(err)
                continue
            for submission, result in zip(batch, results, strict=True):
                submission.result.set_result(result)

    def _write(self, batch: list[Submission]) -> list[tuple[int, JobEventOut | None]]:
        return store_submissions(self.db, batch)


def store_submissions(db: Database, batch: list[Submission]) -> list[tuple[int, JobEventOut | None]]:
    """Store the jobs of `batch` in one transaction; for each, (job id, its queued event),
    or (id of the job first stored with its idempotency key, None)."""
    with db.write() as session:
        results = insert_submissions(session, batch)
        kick_scheduler(session)
    return results


def insert_submissions(session: Session, batch: list[Submission]) -> list[tuple[int, JobEventOut | None]]:
    """`store_submissions` inside a transaction of the caller's (a sweep stores its jobs in
    the one that stores it)."""
    results: list[tuple[int, JobEventOut | None]] = []
    statement = insert_ignoring_duplicates(session, Job).returning(Job.id)
    for submission in batch:
        job_id = session.execute(statement, submission.row).scalar()
        if job_id is None:  # its idempotency key was used before (or earlier in this batch)
            existing = find_by_idempotency_key(session, submission.row["user_id"], submission.row["idempotency_key"])
            assert existing is not None, "a conflicting insert means a job with this key exists"
            results.append((existing.id, None))
            continue
        held = ", on hold" if submission.row.get("on_hold_by") else ""
        results.append((job_id, record_new_job(session, job_id, f"submitted by {submission.user}{held}")))
    return results


def find_by_idempotency_key(session: Session, user_id: int, key: str) -> Job | None:
    return session.scalars(select(Job).where(Job.user_id == user_id, Job.idempotency_key == key)).one_or_none()
