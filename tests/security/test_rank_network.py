"""A rank of a job over several hosts must reach the other ranks of its job, and nothing
else of its host's network: not Redis, not the database, not other jobs. Its user code
tries Redis while its model is built; the job must still train over both hosts."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlparse

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for
from tests.test_multihost import two_hosts

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

PROBE = """
import socket

import keras


def build(params):
    try:
        socket.create_connection(("{host}", {port}), timeout=3).close()
        print("REDIS REACHED", flush=True)
    except OSError as err:
        print(f"REDIS BLOCKED ({{type(err).__name__}})", flush=True)
    inputs = keras.Input(params["input_shape"])
    x = keras.layers.Flatten()(inputs)
    return keras.Model(inputs, keras.layers.Dense(params["num_classes"])(x))
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    settings = make_settings(sqlite_url)
    redis = urlparse(settings.redis_url)
    settings.models_path.mkdir(parents=True, exist_ok=True)
    (settings.models_path / "probe.py").write_text(PROBE.format(host=redis.hostname, port=redis.port))
    return settings


def test_a_rank_reaches_its_peers_but_not_redis(stack: Stack, make_token: Callable[..., str]) -> None:
    client = two_hosts(stack, make_token("mallory"))
    assert all(w["sandboxed"] for w in client.get("/api/workers").json()), "this test needs the sandbox"
    body = {"model": "probe:build", "dataset": "digits", "gpu_count": 4, "hyperparameters": {"steps": 10}}
    job_id = client.post("/api/jobs", json=body).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 240, "the job")
    lines = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]
    assert job["state"] == "succeeded", (job["error"], lines[-20:])
    assert not [m for m in lines if "REDIS REACHED" in m], lines
    blocked = [m for m in lines if "REDIS BLOCKED" in m]
    assert sorted(m.split(" on ")[0] for m in blocked) == ["[rank 0", "[rank 1"], lines
