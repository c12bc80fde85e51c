"""Every answer about a job named its folder's path on its host (`artifacts_dir`) to any
member. That is what aimed the attack of tests/security/test_tool_lookup.py: a job named
another job's host folder, where that one had left a program, first on its `PATH`. A member
reaches a job's files through the API (`/api/jobs/{id}/artifacts`) and needs no host path;
only admins are shown it, in every answer that carries a job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.core.models import JobState
from tests.service.api.conftest import Api

SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0]}
FOLDER = "/srv/towerq/var/artifacts/job-1"


def test_only_admins_are_shown_a_jobs_folder_on_its_host(
    as_user: Callable[..., Api], add_host: Callable[..., None], set_job: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    alice, bob, admin = as_user("alice"), as_user("bob"), as_user("root", admin=True)
    job_id = alice.post("/api/jobs", json={**SPEC, "hold": True}, headers={"Idempotency-Key": "k1"}).json()["id"]
    set_job(job_id, artifacts_dir=FOLDER)

    def folders(api: Api) -> list[Any]:
        """What each answer carrying the job says of its folder."""
        return [
            api.get(f"/api/jobs/{job_id}").json()["artifacts_dir"],
            next(j for j in api.get("/api/jobs").json()["items"] if j["id"] == job_id)["artifacts_dir"],
        ]

    assert folders(admin) == [FOLDER, FOLDER]
    assert folders(alice) == folders(bob) == [None, None]
    # what the owner's changes answer with: a rename, a release, an idempotent submit again
    answers = [
        alice.patch(f"/api/jobs/{job_id}", json={"name": "renamed"}),
        alice.post(f"/api/jobs/{job_id}/release"),
        alice.post(f"/api/jobs/{job_id}/hold"),
        alice.post("/api/jobs", json={**SPEC, "hold": True}, headers={"Idempotency-Key": "k1"}),
    ]
    for answer in answers:
        assert answer.status_code in (200, 201), answer.text
        assert answer.json()["artifacts_dir"] is None, (answer.request.url, answer.text)
    cancelled = alice.post(f"/api/jobs/{job_id}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["artifacts_dir"] is None, cancelled.text
    set_job(job_id, state=JobState.CANCELLED)
    assert admin.get(f"/api/jobs/{job_id}").json()["artifacts_dir"] == FOLDER
