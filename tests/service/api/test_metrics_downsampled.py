"""`GET /api/jobs/{id}/metrics?points=N`: a long series comes down-sampled on the server,
keeping each bucket's lowest and highest loss, so a spike or a dip is never averaged away."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, insert, select

from service.core import rollups
from service.core.db import Database
from service.core.models import Metric, MetricRollup
from tests.service.api.conftest import Api

STEPS = 20_000


@pytest.mark.parametrize("rolled_up", [True, False], ids=["rollups", "window-query"])
def test_a_long_series_is_down_sampled_keeping_its_extremes(alice: Api, db: Database, rolled_up: bool) -> None:
    """From the rollups the relay keeps as it writes rows, or (rows written without them)
    by a window query over the rows: the same extremes survive either way."""
    job_id = alice.post("/api/jobs", json={"model": "mlp", "dataset": "digits", "gpus": [0]}).json()["id"]
    now = datetime.now(UTC)
    rows = []
    for step in range(1, STEPS + 1):
        loss = 2.0 - step / STEPS
        if step == 12_345:
            loss = 9.0  # a spike
        if step == 777:
            loss = -1.0  # a dip
        rows.append({"job_id": job_id, "attempt": 1, "step": step, "split": "train", "loss": loss, "time": now})
    rows += [
        {"job_id": job_id, "attempt": 1, "step": s, "split": "eval", "loss": 1.0, "time": now}
        for s in range(500, STEPS + 1, 500)
    ]
    with db.write() as session:
        session.execute(insert(Metric), rows)
        if rolled_up:
            rollups.fold(session, rows)

    full = alice.get(f"/api/jobs/{job_id}/metrics", params={"split": "train", "limit": 100_000}).json()
    assert len(full) == STEPS
    sampled = alice.get(f"/api/jobs/{job_id}/metrics", params={"split": "train", "points": 200}).json()
    assert 100 <= len(sampled) <= 200
    steps = [row["step"] for row in sampled]
    assert steps == sorted(steps) and 12_345 in steps and 777 in steps
    assert max(row["loss"] for row in sampled) == 9.0 and min(row["loss"] for row in sampled) == -1.0
    both = alice.get(f"/api/jobs/{job_id}/metrics", params={"points": 200}).json()
    assert len([r for r in both if r["split"] == "eval"]) == 40  # a short series comes whole
    assert alice.get(f"/api/jobs/{job_id}/metrics", params={"points": 2}).status_code == 422
    # A chart zoomed into steps 12,000-12,999 asks for that range: 1,000 rows fit, so all come.
    zoomed = alice.get(
        f"/api/jobs/{job_id}/metrics",
        params={"split": "train", "points": 2000, "after_step": 11_999, "until_step": 12_999},
    ).json()
    assert [row["step"] for row in zoomed] == list(range(12_000, 13_000))


def test_a_resumed_attempt_drops_the_rollups_after_its_checkpoint_and_rebuilds_the_cut_bucket(
    alice: Api, db: Database
) -> None:
    job_id = alice.post("/api/jobs", json={"model": "mlp", "dataset": "digits", "gpus": [0]}).json()["id"]
    now = datetime.now(UTC)
    rows = [
        {"job_id": job_id, "attempt": 1, "step": s, "split": "train", "loss": float(s % 97), "time": now}
        for s in range(1, 1001)
    ]
    with db.write() as session:
        session.execute(insert(Metric), rows)
        rollups.fold(session, rows)
        session.execute(Metric.__table__.delete().where(Metric.step > 700))
        rollups.forget_after(session, job_id, 700)
    with db.read() as session:
        kept = {r.bucket: r for r in session.scalars(select(MetricRollup).where(MetricRollup.job_id == job_id))}
        assert max(kept) == 700 // rollups.ROLLUP_STEPS
        cut = kept[700 // rollups.ROLLUP_STEPS]
        steps = range(cut.bucket * rollups.ROLLUP_STEPS, 701)
        assert cut.max_loss == max(float(s % 97) for s in steps) and cut.max_step <= 700
        assert session.scalar(select(func.count()).select_from(MetricRollup)) == len(kept)
