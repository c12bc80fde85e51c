"""Attacks through Redis: anything that reaches it (a trainer with network, any process
on an unsandboxed host) could publish a cancel for anyone's job on a worker's control
channel, and the worker obeyed. A control message now only makes the worker read the job's
row; and the Redis `towerq up` starts for itself asks for a password."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from service.cli.redis_server import EmbeddedRedis, embedded_url
from service.core import keys
from service.core.settings import Settings
from tests.conftest import free_port
from tests.stack import Stack, wait_for

FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


@pytest.mark.slow
def test_a_forged_cancel_on_the_control_channel_stops_nobody(
    stack: Stack, redis_client: redis.Redis, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_pool=0)
    alice = stack.client(make_token("alice"))
    wait_for(lambda: alice.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    spec = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 100000, "log_every": 10}}
    job_id = alice.post("/api/jobs", json=spec).json()["id"]
    wait_for(lambda: (alice.get(f"/api/jobs/{job_id}").json()["step"] or 0) >= 10, 120, "the job to train")
    forged = {"type": "cancel", "job_id": job_id, "attempt": 1, "host": "lab-a", "by": "alice"}
    for kind in ("cancel", "preempt"):
        redis_client.publish(keys.host_control_channel("lab-a"), json.dumps({**forged, "type": kind}))
    time.sleep(3)  # the worker reads the row within a second of a message; it must find nothing asked
    job = alice.get(f"/api/jobs/{job_id}").json()
    assert job["state"] == "running" and job["attempts"] == 1, job
    assert alice.post(f"/api/jobs/{job_id}/cancel").status_code == 202
    job = wait_for(lambda: (j := alice.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 60, "cancel", 0.3)
    assert job["state"] == "cancelled"
    alice.close()


def test_the_embedded_redis_asks_for_a_password(tmp_path: Path) -> None:
    plain = f"redis://127.0.0.1:{free_port()}/0"
    url = embedded_url(plain)
    assert url != plain and embedded_url(url) == url  # a password given is kept
    server = EmbeddedRedis(url, tmp_path / "redis")
    server.start()
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(plain).ping()
        assert redis.Redis.from_url(url).ping()
    finally:
        server.stop()
