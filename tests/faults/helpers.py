"""What the fault tests check after the dust settles."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import update

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
