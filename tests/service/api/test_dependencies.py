"""`after` at submit (SQLite and PostgreSQL): the jobs and sweeps a job waits for are
checked and resolved to job ids, and a reference that could never be satisfied, or that
would make another member's private folder this job's input, is refused naming `after`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from service.core.db import Database
from service.core.models import Job, JobState
from tests.service.api.conftest import Api

SPEC: dict[str, Any] = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}


def stored(db: Database, job_id: int) -> tuple[list[int] | None, str | None]:
    with db.read() as session:
        after, condition = session.execute(select(Job.after_jobs, Job.after_condition).where(Job.id == job_id)).one()
        return after, condition


def refusal(answer: Any) -> str:
    assert answer.status_code == 422, answer.text
    assert "after" in answer.text
    return str(answer.json())


def test_after_names_jobs_and_sweeps_resolved_to_job_ids(alice: Api, db: Database) -> None:
    first = alice.post("/api/jobs", json=SPEC).json()["id"]
    sweep = alice.post(
        "/api/sweeps",
        json={"name": "s", "base": SPEC, "grid": {"hyperparameters.seed": [1, 2]}, "metric": "eval_accuracy"},
    ).json()
    swept = [job["id"] for job in sweep["jobs"]]
    job = alice.post("/api/jobs", json={**SPEC, "after": [first, f"sweep:{sweep['id']}"]})
    assert job.status_code == 201, job.text
    assert stored(db, job.json()["id"]) == (sorted([first, *swept]), "afterok")
    plain = alice.post("/api/jobs", json=SPEC).json()["id"]
    assert stored(db, plain) == (None, None)
    anyway = alice.post("/api/jobs", json={**SPEC, "after": [first], "after_condition": "afterany"}).json()["id"]
    assert stored(db, anyway) == ([first], "afterany")


def test_after_refuses_what_could_never_be_satisfied_or_is_not_yours_to_read(
    alice: Api, as_user: Callable[..., Api], db: Database, set_job: Callable[..., None]
) -> None:
    assert "job 999 does not exist" in refusal(alice.post("/api/jobs", json={**SPEC, "after": [999]}))
    assert "sweep 7 does not exist" in refusal(alice.post("/api/jobs", json={**SPEC, "after": ["sweep:7"]}))
    assert "named only once" in refusal(alice.post("/api/jobs", json={**SPEC, "after": [1, 1]}))
    answer = alice.post("/api/jobs", json={**SPEC, "after": [1, "job:1"]})
    assert [d["msg"] for d in answer.json()["detail"]] == ["after.1: 'job:1' is neither a job's id nor sweep:ID"]

    failed = alice.post("/api/jobs", json=SPEC).json()["id"]
    set_job(failed, state=JobState.FAILED, error="diverged")
    said = refusal(alice.post("/api/jobs", json={**SPEC, "after": [failed]}))
    assert f"job {failed} failed: a job after it (afterok) could never start" in said
    anyway = alice.post("/api/jobs", json={**SPEC, "after": [failed], "after_condition": "afterany"})
    assert anyway.status_code == 201, anyway.text

    bob = as_user("bob")
    private = bob.post("/api/jobs", json=SPEC).json()["id"]
    assert f"job {private} is bob's and private" in refusal(alice.post("/api/jobs", json={**SPEC, "after": [private]}))
    shared = bob.post("/api/jobs", json={**SPEC, "visibility": "lab"}).json()["id"]
    assert alice.post("/api/jobs", json={**SPEC, "after": [shared]}).status_code == 201
