"""Cancelling jobs: asked in the database, then told to their executor once that commits
(a running job's worker, or Slurm, stops it). One path for a job's cancel and a sweep's."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from service.core.db import Database
from service.executors import Executor
from towerq.contract.messages import CancelMessage


def cancel_then_stop(db: Database, executor: Executor, ask: Callable[[Session], list[CancelMessage]]) -> None:
    """Run `ask` in one write transaction (it cancels queued jobs and asks running ones to
    stop: `lifecycle.request_cancel`, whose messages it returns); once that has committed,
    tell the executor to stop each. Told before the commit, a worker could read the job's
    row before the request is in it."""
    with db.write() as session:
        messages = ask(session)
    for message in messages:
        executor.stop(message)
