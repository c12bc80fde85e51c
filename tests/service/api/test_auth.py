"""Who may do what: tokens, owners, admins; and the limits on what anyone may send."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from fastapi.testclient import TestClient
from sqlalchemy import select

from service.core.db import Database
from service.core.models import ApiToken
from service.core.settings import Settings
from tests.service.api.conftest import Api

SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 1}


def test_token_create_prints_the_token_alone_on_its_last_line_and_stores_only_its_hash(
    settings: Settings, db: Database
) -> None:
    env = {"TOWERQ_DATABASE_URL": settings.database_url, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "token", "create", "--user", "carol", "--admin"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    token = out.strip().splitlines()[-1]
    assert token.startswith("tq_") and " " not in token
    with db.read() as session:
        stored = session.scalars(select(ApiToken.token_hash)).all()
    assert token not in stored and len(stored) == 1 and len(stored[0]) == 64
    listing = subprocess.run(
        [sys.executable, "-m", "service.cli", "user", "list"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "carol" in listing and "yes" in listing


def test_only_admins_list_users_change_limits_and_drain_gpus(alice: Api, as_user: Callable[..., Api]) -> None:
    admin = as_user("root", admin=True)
    for method, path, body in (
        ("get", "/api/users", None),
        ("patch", "/api/users/alice", {"gpu_limit": 2}),
        ("post", "/api/gpus/lab-a/0/drain", None),
    ):
        refused = alice.client.request(method.upper(), path, json=body, headers=alice.headers)
        assert refused.status_code == 403
        assert refused.json() == {"detail": "admins only"}
    changed = admin.client.patch("/api/users/alice", json={"gpu_limit": 2, "share": 3}, headers=admin.headers)
    assert changed.status_code == 200
    assert (changed.json()["gpu_limit"], changed.json()["share"]) == (2, 3)
    drained = admin.post("/api/gpus/lab-a/0/drain")
    assert [g["drained"] for g in drained.json()] == [True, False, False, False]
    assert admin.client.patch("/api/users/nobody", json={}, headers=admin.headers).status_code == 404


def test_a_revoked_token_is_refused_at_once(alice: Api, client: TestClient) -> None:
    created = alice.post("/api/users/alice/tokens", json={"name": "laptop"})
    assert created.status_code == 201
    fresh = {"Authorization": f"Bearer {created.json()['token']}"}
    me = {"user": "alice", "is_admin": False, "token_id": created.json()["id"], "places_jobs": True}
    assert client.get("/api/me", headers=fresh).json() == me
    revoked = client.delete(f"/api/tokens/{created.json()['id']}", headers=alice.headers)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = client.get("/api/me", headers=fresh)
    assert refused.status_code == 401
    assert refused.json() == {"detail": "token revoked"}


def test_users_manage_their_own_tokens_only(alice: Api, as_user: Callable[..., Api]) -> None:
    bob = as_user("bob")
    assert bob.post("/api/users/alice/tokens", json={}).status_code == 403
    assert bob.post("/api/users/bob/tokens", json={"admin": True}).json() == {
        "detail": "only admins create admin tokens"
    }
    alice_tokens = alice.get("/api/tokens").json()
    assert {t["user"] for t in alice_tokens} == {"alice"}
    assert bob.client.delete(f"/api/tokens/{alice_tokens[0]['id']}", headers=bob.headers).status_code == 404


def test_owners_and_admins_change_a_queued_job_others_may_not(alice: Api, as_user: Callable[..., Api]) -> None:
    job = alice.post("/api/jobs", json=SPEC).json()
    root = as_user("root", admin=True)
    allow = root.client.patch("/api/users/alice", json={"max_priority": "high"}, headers=root.headers)
    assert allow.json()["max_priority"] == "high"
    bob = as_user("bob")
    refused = bob.client.patch(f"/api/jobs/{job['id']}", json={"priority": "high"}, headers=bob.headers)
    assert refused.status_code == 403
    changed = alice.client.patch(
        f"/api/jobs/{job['id']}", json={"priority": "high", "name": "urgent run"}, headers=alice.headers
    )
    assert (changed.json()["priority"], changed.json()["name"]) == ("high", "urgent run")
    assert (changed.json()["spec"]["priority"], changed.json()["spec"]["name"]) == ("high", "urgent run")
    alice.post(f"/api/jobs/{job['id']}/cancel")
    late = alice.client.patch(f"/api/jobs/{job['id']}", json={"priority": "low"}, headers=alice.headers)
    assert late.status_code == 409
    assert "its priority changes only while it is queued" in late.json()["detail"]


def test_a_body_over_the_limit_is_refused_before_it_is_read(alice: Api, settings: Settings) -> None:
    big = {**SPEC, "name": "x" * (settings.max_request_bytes + 10)}
    response = alice.post("/api/jobs", json=big)
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"request body larger than {settings.max_request_bytes} bytes (TOWERQ_MAX_REQUEST_BYTES)"
    }


def test_every_string_field_has_a_length_limit(alice: Api) -> None:
    for field, value in (
        ("name", "n" * 129),
        ("model", "m" * 201),
        ("host", "h" * 129),
        ("hyperparameters", {"model_options": {"k": "v" * 257}}),
        ("dataset_options", {"test_path": "p" * 1025}),
    ):
        response = alice.post("/api/jobs", json={**SPEC, field: value})
        assert response.status_code == 422, field
        assert "at most" in response.json()["detail"][0]["msg"], response.json()


def test_high_priority_is_for_admins_and_users_an_admin_allows(alice: Api, as_user: Callable[..., Api]) -> None:
    refused = alice.post("/api/jobs", json={**SPEC, "priority": "high"})
    assert refused.status_code == 403
    assert refused.json() == {
        "detail": "priority high is for admins and for users an admin allows "
        "(`towerq user set alice --max-priority high`); you may use up to normal"
    }
    queued = alice.post("/api/jobs", json=SPEC).json()
    assert (
        alice.client.patch(f"/api/jobs/{queued['id']}", json={"priority": "high"}, headers=alice.headers).status_code
        == 403
    )
    assert alice.post("/api/jobs", json={**SPEC, "priority": "low"}).status_code == 201

    root = as_user("root", admin=True)
    assert root.post("/api/jobs", json={**SPEC, "priority": "high"}).status_code == 201
    bob = as_user("bob")
    assert bob.client.patch("/api/users/alice", json={"max_priority": "high"}, headers=bob.headers).status_code == 403
    users = {u["name"]: u for u in root.get("/api/users").json()}
    assert (users["alice"]["max_priority"], users["root"]["max_priority"]) == ("normal", "high")
    assert root.client.patch("/api/users/alice", json={"max_priority": "high"}, headers=root.headers).status_code == 200
    assert alice.post("/api/jobs", json={**SPEC, "priority": "high"}).status_code == 201

    # What an admin may do is cached with their token, but a change applies at once; no admin
    # can lock themselves out by taking away their own admin rights.
    demote = root.client.patch("/api/users/root", json={"is_admin": False}, headers=root.headers)
    assert (demote.status_code, demote.json()) == (
        403,
        {"detail": "you cannot take away your own admin rights: another admin must"},
    )
    assert root.get("/api/users").status_code == 200


def test_the_stream_of_a_job_that_does_not_exist_is_404_naming_it_not_a_revoked_token(alice: Api) -> None:
    """It said "token revoked" (401): `towerq logs -f` on a mistyped id told a member their
    token was gone, and the API fuzzer saw an operation that only ever refused its token."""
    response = alice.get("/api/jobs/987654/stream")
    assert response.status_code == 404 and "987654" in response.json()["detail"], response.text
