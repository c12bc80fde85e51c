"""Adaptive sweeps through the API and the database: `early_stopping` is checked at submit
(422 naming the field), and the searcher (service.jobs.asha.decide_sweep) decides each setting
at each rung from the metric rows, once: again after a restart it decides nothing new, a
failed setting is the worst at its next rung, and a stopped one is asked to stop with the
reason. The metric rows are written here, as a trainer's relay would: no training."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from service.core.db import Database
from service.core.models import Job, JobState, Metric, Sweep, SweepRung, utcnow
from service.jobs.asha import decide_sweep
from service.scheduler.holdbacks import held_by_sweeps
from tests.service.api.conftest import Api

BASE = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 400, "eval_every": 50}}
EARLY = {"method": "asha", "min_steps": 50, "reduction_factor": 2}


def adaptive_sweep(alice: Api, count: int, **more: Any) -> dict:
    body = {
        "name": "asha",
        "base": BASE,
        "grid": {"hyperparameters.seed": list(range(1, count + 1))},
        "metric": "eval_accuracy",
        "early_stopping": EARLY,
        **more,
    }
    created = alice.post("/api/sweeps", json=body)
    assert created.status_code == 201, created.text
    return created.json()


def test_early_stopping_is_checked_at_submit(alice: Api) -> None:
    body = {"name": "x", "base": BASE, "grid": {"hyperparameters.seed": [1, 2]}, "metric": "eval_accuracy"}
    for early, field, said in [
        ({"min_steps": 40}, "min_steps", "the rung at step 40 has no eval_accuracy to compare: eval_every 50"),
        ({"min_steps": 400}, "min_steps", "is not below the 400 steps"),
        ({"min_steps": 50, "reduction_factor": 1}, "reduction_factor", "greater than or equal to 2"),
        ({"min_steps": 50, "method": "hyperband"}, "method", "'asha'"),
    ]:
        refused = alice.post("/api/sweeps", json={**body, "early_stopping": early})
        assert refused.status_code == 422, refused.text
        problem = refused.json()["detail"][0]
        assert problem["loc"][-2:] == ["early_stopping", field] and said in problem["msg"], problem
    assert alice.post("/api/sweeps", json={**body, "early_stopping": {"min_steps": 50}}).status_code == 201


def report(db: Database, job_id: int, step: int, accuracy: float, seconds: float) -> None:
    with db.write() as session:
        session.add(
            Metric(
                job_id=job_id, attempt=1, step=step, split="eval", loss=1 - accuracy, accuracy=accuracy,
                time=utcnow() + timedelta(seconds=seconds),
            )
        )  # fmt: skip


def decide(db: Database, sweep_id: int) -> list[int]:
    with db.write() as session:
        return [m.job_id for m in decide_sweep(session, session.get(Sweep, sweep_id))]


def test_the_searcher_decides_each_setting_once_at_each_rung(alice: Api, db: Database) -> None:
    sweep = adaptive_sweep(alice, 4)
    a, b, c, d = (job["id"] for job in sweep["jobs"])
    with db.write() as session:
        session.execute(
            update(Job).where(Job.sweep_id == sweep["id"]).values(state=JobState.RUNNING.value, started_at=utcnow())
        )
    # rung 1 (step 50), reduction factor 2: a 0.6 goes on (first); b 0.4: 2 there, keep 1,
    # behind a: stopped; c 0.7: 3 there, keep 1, the best: goes on
    report(db, a, 50, 0.6, 1)
    report(db, b, 50, 0.4, 2)
    report(db, c, 50, 0.7, 3)
    assert decide(db, sweep["id"]) == [b]
    assert decide(db, sweep["id"]) == []  # decided once: a restart decides nothing new
    # d fails before the rung: the worst there; a reaches rung 2 (step 100) first and goes on
    with db.write() as session:
        job = session.get(Job, d)
        job.state, job.finished_at = JobState.FAILED.value, utcnow() + timedelta(seconds=4)
    report(db, a, 100, 0.65, 5)
    assert decide(db, sweep["id"]) == []
    # c at rung 2: 2 there, keep 1, c 0.61 behind a's 0.65: stopped
    report(db, c, 100, 0.61, 6)
    assert decide(db, sweep["id"]) == [c]
    with db.read() as session:
        rows = {(r.job_id, r.rung): r for r in session.scalars(select(SweepRung))}
        stopped_b = session.get(Job, b)
        assert stopped_b.cancel_requested_at is not None
        assert stopped_b.stop_reason == (
            f"stopped early by sweep {sweep['id']} at rung 1 (step 50): eval_accuracy 0.4, the rung's cut 0.6"
        )
    assert sorted(rows) == [(a, 0), (a, 1), (b, 0), (c, 0), (c, 1), (d, 0)]
    assert rows[(d, 0)].value is None and not rows[(d, 0)].stopped  # it ended: worst, not stopped
    assert [rows[(j, 0)].stopped for j in (a, b, c)] == [False, True, False] and rows[(c, 1)].stopped
    assert rows[(c, 1)].cut == 0.65
    shown = alice.get(f"/api/sweeps/{sweep['id']}").json()
    assert shown["early_stopping"]["reduction_factor"] == 2
    assert [(r["job_id"], r["rung"], r["stopped"]) for r in shown["rungs"]] == [
        (a, 1, False), (b, 1, True), (c, 1, False), (d, 1, False), (a, 2, False), (c, 2, True),
    ]  # fmt: skip


def test_a_stopped_setting_gives_its_place_under_max_parallel_to_the_next(alice: Api, db: Database) -> None:
    sweep = adaptive_sweep(alice, 4, max_parallel=2)
    a, b, c, d = (job["id"] for job in sweep["jobs"])
    with db.write() as session:
        session.execute(update(Job).where(Job.id.in_([a, b])).values(state=JobState.RUNNING.value, started_at=utcnow()))
    with db.read() as session:
        assert sorted(held_by_sweeps(session, [c, d])) == [c, d]
    report(db, a, 50, 0.6, 1)
    report(db, b, 50, 0.4, 2)
    assert decide(db, sweep["id"]) == [b]  # asked to stop: it still holds its GPU until it has
    with db.read() as session:
        assert sorted(held_by_sweeps(session, [c, d])) == [c, d]
    with db.write() as session:  # its worker ends it, as a stop by the sweep ends
        session.execute(update(Job).where(Job.id == b).values(state=JobState.SUCCEEDED.value, finished_at=utcnow()))
    with db.read() as session:
        assert sorted(held_by_sweeps(session, [c, d])) == [d], "c takes b's place; d still waits"
