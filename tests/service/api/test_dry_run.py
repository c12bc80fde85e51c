"""`POST /api/jobs?dry_run=true`: the spec checked, nothing stored, and when it would start:
at once on free GPUs, else when the scheduler's replay of the live queue frees room."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from service.core.db import Database
from service.core.models import Job
from service.scheduler.costs import CHECKPOINT_S
from tests.service.api.conftest import Api
from tests.service.api.test_usage import add_run

SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 2}


def stored(api: Api) -> int:
    return api.get("/api/jobs").json()["total"]


def test_on_free_gpus_it_would_start_now_and_nothing_is_stored(alice: Api) -> None:
    before = stored(alice)
    answer = alice.post("/api/jobs", params={"dry_run": "true"}, json=SPEC)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["dry_run"] and body["starts_now"] and body["expected_host"] == "lab-a" and body["starts_on"] == 2
    assert abs((datetime.fromisoformat(body["expected_start_at"]) - datetime.now(UTC)).total_seconds()) < 5
    assert body["queue_position"] is None and stored(alice) == before


def test_on_busy_gpus_it_says_where_it_would_wait_and_when_it_would_start(alice: Api, db: Database) -> None:
    now = datetime.now(UTC)
    busy = add_run(db, "bob", "lab-a", [0, 1, 2, 3], now - timedelta(minutes=20), now - timedelta(minutes=10), None)
    with db.write() as session:
        session.execute(update(Job).where(Job.id == busy).values(time_limit_s=3600))
    before = stored(alice)
    body = alice.post("/api/jobs", params={"dry_run": "true"}, json=SPEC).json()
    assert body["starts_now"] is False and body["queue_position"] == 1
    assert "lab-a" in body["reason"]
    expected = datetime.fromisoformat(body["expected_start_at"])
    # Not when bob's limit runs out (in 50 minutes): time slicing stops his job once it has
    # had its GPU-hour, 15 minutes in on 4 GPUs, and it takes CHECKPOINT_S to stop.
    assert abs((expected - (now + timedelta(minutes=5, seconds=CHECKPOINT_S))).total_seconds()) < 5
    assert body["expected_host"] == "lab-a" and stored(alice) == before


def test_an_elastic_job_would_start_now_on_the_gpus_that_are_free(alice: Api, db: Database) -> None:
    now = datetime.now(UTC)
    add_run(db, "bob", "lab-a", [0, 1, 2], now - timedelta(minutes=20), now - timedelta(minutes=10), None)
    elastic = {**SPEC, "gpu_count": 4, "min_gpu_count": 1}
    body = alice.post("/api/jobs", params={"dry_run": "true"}, json=elastic).json()
    assert (body["starts_now"], body["starts_on"], body["expected_host"]) == (True, 1, "lab-a")
    rigid = alice.post("/api/jobs", params={"dry_run": "true"}, json={**elastic, "min_gpu_count": 2}).json()
    assert (rigid["starts_now"], rigid["starts_on"], rigid["queue_position"]) == (False, None, 1)


def test_a_bad_spec_in_a_dry_run_gets_the_same_error_naming_the_field(alice: Api) -> None:
    answer = alice.post("/api/jobs", params={"dry_run": "true"}, json={**SPEC, "gpu_count": 99})
    assert answer.status_code == 422 and "gpu_count" in answer.text
    assert stored(alice) == 0
