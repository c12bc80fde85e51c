"""Reservations over the API (SQLite and PostgreSQL): admins keep GPUs for a group over a
window, chosen on as few hosts as hold them; what cannot be honoured is refused naming the
field; a live pass keeps the GPUs for the group, tells others why they wait, and (with
preemption on) stops a borrower still there when the window begins."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from service.core.db import Database
from service.core.models import Job, JobState, utcnow
from service.core.settings import Settings
from tests.service.api.conftest import Api
from tests.service.api.test_groups import one_pass
from tests.service.api.test_usage import add_run

SPEC: dict[str, Any] = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}


def window(start_h: float, end_h: float) -> dict[str, str]:
    now = utcnow()
    return {"start": (now + timedelta(hours=start_h)).isoformat(), "end": (now + timedelta(hours=end_h)).isoformat()}


def stop_reason(db: Database, job_id: int) -> str | None:
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.stop_reason if job.preempt_requested_at is not None else None


def refusal(answer: Any, field: str) -> str:
    assert answer.status_code == 422, answer.text
    assert field in answer.text
    return answer.text


def test_a_reservation_keeps_gpus_on_as_few_hosts_as_hold_them_and_refuses_what_cannot_be(
    alice: Api, as_user: Callable[..., Api], add_host: Callable[..., None], db: Database
) -> None:
    add_host("lab-b", 2)  # lab-a has 4
    admin = as_user("root", admin=True)
    admin.post("/api/groups", json={"name": "nlp"})
    body = {"group": "nlp", "gpus": 3, **window(1, 3), "note": "ACL deadline"}
    assert alice.post("/api/reservations", json=body).status_code == 403
    now = utcnow()
    holder = add_run(db, "bob", "lab-a", [0], now - timedelta(hours=1), now - timedelta(hours=1), None)
    made = admin.post("/api/reservations", json=body)
    assert made.status_code == 201, made.text
    kept = made.json()
    assert [(g["host"], g["index"]) for g in kept["gpus"]] == [("lab-a", 1), ("lab-a", 2), ("lab-a", 3)]
    assert kept["active"] is False and kept["note"] == "ACL deadline" and kept["held_past_start"] == []
    # Four more: what is left is lab-a's GPU 0 (bob's job runs there, with no time limit) and lab-b.
    more = admin.post("/api/reservations", json={**body, "gpus": 3}).json()
    assert [(g["host"], g["index"]) for g in more["gpus"]] == [("lab-a", 0), ("lab-b", 0), ("lab-b", 1)]
    assert [(h["job_id"], h["ends_at"]) for h in more["held_past_start"]] == [(holder, None)]

    assert "the lab has 6" in refusal(admin.post("/api/reservations", json={**body, "gpus": 7}), "gpus")
    said = refusal(admin.post("/api/reservations", json={**body, "gpus": 1}), "gpus")
    assert f"reservation {kept['id']}" in said and f"reservation {more['id']}" in said
    assert admin.post("/api/reservations", json={**body, "gpus": 1, **window(4, 5)}).status_code == 201  # after
    refusal(admin.post("/api/reservations", json={**body, **window(3, 2)}), "end")
    refusal(admin.post("/api/reservations", json={**body, "group": "robots"}), "group")
    refusal(admin.post("/api/reservations", json={**body, "gpus": 3, "host": "lab-b", **window(6, 7)}), "gpus")
    refusal(admin.post("/api/reservations", json={**body, "start": "2026-01-01T10:00"}), "start")  # no zone

    assert [r["id"] for r in alice.get("/api/reservations").json()] == [kept["id"], more["id"], kept["id"] + 2]
    assert admin.delete(f"/api/reservations/{more['id']}").status_code == 200
    assert admin.delete(f"/api/reservations/{more['id']}").status_code == 404
    held = admin.delete("/api/groups/nlp")
    assert held.status_code == 409 and "reservations not yet over" in held.text


def test_a_pass_keeps_the_window_for_the_group_and_says_so_to_others(
    settings: Settings, make_settings: Callable[..., Settings], database_url: str,
    alice: Api, as_user: Callable[..., Api], db: Database,
) -> None:  # fmt: skip
    admin = as_user("root", admin=True)
    erin = as_user("erin")
    for group, user in (("nlp", "erin"), ("vision", "alice")):
        admin.post("/api/groups", json={"name": group})
        admin.put(f"/api/groups/{group}/members/{user}", json={})
    # A vision job already runs on GPU 3 (no time limit) when all of lab-a is kept for nlp.
    now = utcnow()
    borrower = add_run(db, "alice", "lab-a", [3], now - timedelta(hours=1), now - timedelta(hours=1), None,
                       group="vision")  # fmt: skip
    made = admin.post("/api/reservations", json={"group": "nlp", "gpus": 2, "host": "lab-a", **window(0, 2)}).json()
    assert [g["index"] for g in made["gpus"]] == [0, 1]  # the free ones first
    admin.delete(f"/api/reservations/{made['id']}")
    every = admin.post("/api/reservations", json={"group": "nlp", "gpus": 4, "host": "lab-a", **window(0, 2)})
    assert [h["job_id"] for h in every.json()["held_past_start"]] == [borrower]
    kept = {g["index"]: g["reserved"] for g in alice.get("/api/gpus").json() if g["host"] == "lab-a"}
    assert all(k is not None and (k["group"], k["id"], k["now"]) == ("nlp", every.json()["id"], True)
               for k in kept.values()), kept  # fmt: skip

    theirs = erin.post("/api/jobs", json={**SPEC, "gpu_count": 2}).json()["id"]
    waiting = alice.post("/api/jobs", json={**SPEC, "gpu_count": 2}).json()["id"]
    one_pass(settings)
    assert erin.get(f"/api/jobs/{theirs}").json()["state"] == JobState.DISPATCHED
    job = alice.get(f"/api/jobs/{waiting}").json()
    assert job["state"] == JobState.QUEUED
    assert " on lab-a reserved for group nlp until " in job["pending_reason"], job["pending_reason"]
    assert stop_reason(db, borrower) is None  # preemption off: it runs on

    one_pass(make_settings(database_url, preemption=True))
    said = stop_reason(db, borrower)
    assert said is not None and said.startswith("its GPUs are reserved for group nlp from now"), said
