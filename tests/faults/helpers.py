"""What the fault tests check after the dust settles."""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import update
from sqlalchemy.engine import make_url

from service.core.db import Database
from service.core.models import Allocation, utcnow
from tests.stack import wait_for
from worker.processes import pid_alive, trainer_pids

__all__ = [
    "FINAL",
    "assert_metrics_continuous",
    "backdate_allocations",
    "job_of",
    "pid_alive",
    "trainer_pids",
    "wait_state",
    "wait_step",
]

FINAL = ("succeeded", "failed", "cancelled")


def job_of(client: httpx.Client, job_id: int) -> dict[str, Any]:
    response = client.get(f"/api/jobs/{job_id}")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def wait_state(client: httpx.Client, job_id: int, states: tuple[str, ...], timeout: float = 240) -> dict[str, Any]:
    return wait_for(
        lambda: (j := job_of(client, job_id))["state"] in states and j, timeout, f"job {job_id} to be {states}", 0.3
    )


def wait_step(client: httpx.Client, job_id: int, step: int, timeout: float = 240) -> dict[str, Any]:
    return wait_for(
        lambda: (j := job_of(client, job_id))["step"] is not None and j["step"] >= step and j,
        timeout,
        f"job {job_id} to reach step {step}",
        0.2,
    )


def assert_metrics_continuous(client: httpx.Client, job_id: int, every: int, total: int) -> list[dict[str, Any]]:
    """One train point per `every` steps up to `total`, none twice."""
    points = [m for m in client.get(f"/api/jobs/{job_id}/metrics").json() if m["split"] == "train"]
    steps = [m["step"] for m in points]
    assert steps == list(range(every, total + 1, every)), steps
    return points


def backdate_allocations(database_url: str, job_id: int, hours: float) -> None:
    """As if the job's current attempt had run `hours` already (every host's part of it):
    past its time slice and the 10-minute floor, for a time-slicing test."""
    db = Database(database_url)
    try:
        with db.write() as session:
            session.execute(
                update(Allocation)
                .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
                .values(created_at=utcnow() - timedelta(hours=hours))
            )
    finally:
        db.dispose()


@contextmanager
def paused_outside_a_write(pid: int, database_url: str) -> Iterator[None]:
    """SIGSTOP `pid` (a worker) at a moment it holds no database write, and SIGCONT it after
    the block. With SQLite, one process writes at a time: a process stopped inside a write
    holds every writer of the service (the scheduler's detection of dead hosts included)
    until it goes on, which a clean-clone run met as a flake (issue 50). Holding the
    writers' lock while stopping it makes the pause a host's, not the database's."""
    database = make_url(database_url).database
    lock = open(f"{database}.writers", "a+b") if database_url.startswith("sqlite") and database else None  # noqa: SIM115
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        os.kill(pid, signal.SIGSTOP)
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_UN)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
        if lock is not None:
            lock.close()
