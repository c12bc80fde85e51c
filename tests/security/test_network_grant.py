"""Any member could ask `network: true`, and `towerq up` took a password-less Redis without a
word: such a job reached both Redis servers and the API. Now the network is an admin's grant
per member, and refused while Redis or the database takes no password. And a member could
ask 100 attempts of a job that crashes on purpose: now TOWERQ_MAX_ATTEMPTS_LIMIT caps it."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from service.api.app import create_app
from service.core.settings import Settings
from tests.service.api.conftest import Api

SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0], "network": True}


def test_the_network_is_an_admins_grant(
    as_user: Callable[..., Api], add_host: Callable[..., None], settings: Settings
) -> None:
    add_host("lab-a", 2)
    bob, admin = as_user("bob"), as_user("root", admin=True)
    refused = bob.post("/api/jobs", json=SPEC)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"][-1] == "network" and "admin's grant" in refused.text
    assert bob.patch("/api/users/bob", json={"may_use_network": True}).status_code == 403  # not his to give
    granted = admin.patch("/api/users/bob", json={"may_use_network": True})
    assert granted.status_code == 200 and granted.json()["may_use_network"] is True
    answer = bob.post("/api/jobs", json=SPEC)
    if "@" in settings.redis_url:  # a Redis with a password: the grant is enough
        assert answer.status_code == 201, answer.text
    else:
        assert answer.status_code == 422 and "TOWERQ_REDIS_URL has no password" in answer.text, answer.text
    assert bob.post("/api/jobs", json={**SPEC, "network": False}).status_code == 201


def test_a_granted_network_job_is_refused_while_redis_takes_no_password(
    settings: Settings, make_token: Callable[..., str], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    bare = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(bare)) as client:
        root = Api(client, make_token("root", admin=True))
        refused = root.post("/api/jobs", json=SPEC)
    assert refused.status_code == 422 and "TOWERQ_REDIS_URL has no password" in refused.text, refused.text


def test_a_members_max_attempts_is_capped_by_the_admin(
    as_user: Callable[..., Api], add_host: Callable[..., None]
) -> None:
    """A trainer that crashes on purpose (exit 143) is tried `max_attempts` times, each attempt
    writing its log and metrics anew: a member asked 100."""
    add_host("lab-a", 2)
    spec = {"model": "mlp", "dataset": "digits", "gpus": [0], "max_attempts": 100}
    refused = as_user("bob").post("/api/jobs", json=spec)
    assert refused.status_code == 422 and "TOWERQ_MAX_ATTEMPTS_LIMIT" in refused.text, refused.text
    assert refused.json()["detail"][0]["loc"][-1] == "max_attempts"
    assert as_user("bob").post("/api/jobs", json={**spec, "max_attempts": 10}).status_code == 201
    assert as_user("root", admin=True).post("/api/jobs", json=spec).status_code == 201
