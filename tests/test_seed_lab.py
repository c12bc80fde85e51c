"""scripts/seed-lab.py makes a lab worth looking at: every state, with reasons, curves and
GPU history, readable by the API's own queries."""

from __future__ import annotations

from sqlalchemy import func, select

from service.core.db import Database
from service.core.models import Allocation, Job, Metric
from service.jobs.read import list_jobs
from tests.stack import load_script


def test_the_seeded_lab_has_every_state_with_its_reason_and_history(sqlite_url: str) -> None:
    seed_lab = load_script("seed-lab.py")
    assert seed_lab.main(["--database-url", sqlite_url, "--jobs", "120"]) == 0

    db = Database(sqlite_url)
    with db.read() as session:
        states = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
        assert set(states) == {"queued", "running", "succeeded", "failed", "cancelled"}, states
        assert sum(states.values()) == 120
        assert session.scalar(select(func.count(Metric.id))) > 1000
        assert session.scalar(select(func.count(Allocation.id)).where(Allocation.released_at.is_(None))) > 0
        page = list_jobs(session, limit=500, offset=0)
        assert all(job.reason for job in page.items if job.state in ("queued", "failed", "cancelled"))
        positions = sorted(job.queue_position for job in page.items if job.state == "queued")
        assert positions == list(range(1, len(positions) + 1))  # the line, from its head
    db.dispose()
