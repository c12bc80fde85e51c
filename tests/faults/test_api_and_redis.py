"""The API killed, Redis flushed, Redis restarted: running jobs carry on, nothing is lost,
nothing runs twice (one `running` event per attempt)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from service.cli.redis_server import EmbeddedRedis
from service.core import launches
from service.core.settings import Settings
from tests.conftest import free_port
from tests.faults.helpers import FINAL, job_of, wait_state, wait_step
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
JOB = {
    "model": "mlp",
    "dataset": "digits",
    "gpu_count": 1,
    "hyperparameters": {"steps": 1500, "batch_size": 16, "log_every": 10, "checkpoint_every": 100},
}


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis server this test may flush, stop and start again."""
    server = EmbeddedRedis(f"redis://127.0.0.1:{free_port()}/0", tmp_path / "own-redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str, own_redis: EmbeddedRedis) -> Settings:
    return make_settings(sqlite_url, redis_url=own_redis.url, dispatch_timeout_s=2.0, heartbeat_timeout_s=5.0)


def assert_ran_once_per_attempt(job: dict) -> None:
    running = [e["attempt"] for e in job["events"] if e["state"] == "running"]
    assert len(running) == len(set(running)), job["events"]


def start(stack: Stack, make_token: Callable[..., str], gpus: int = 4):
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", gpus)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register")
    return client


def test_jobs_carry_on_while_the_api_is_killed_and_the_restarted_api_shows_them(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    client = start(stack, make_token)
    job_id = client.post("/api/jobs", json=JOB).json()["id"]
    wait_step(client, job_id, 100)
    stack.stop("api", signal.SIGKILL)
    stack.start_api()
    client = stack.client(make_token("bob"))
    during = job_of(client, job_id)
    assert during["state"] in ("running", "succeeded")
    assert during["step"] is not None and during["step"] >= 100
    done = wait_state(client, job_id, FINAL)
    assert done["state"] == "succeeded" and done["attempts"] == 1
    assert_ran_once_per_attempt(done)


def test_a_launch_lost_with_a_flushed_redis_is_sent_again_and_the_job_runs_once(
    stack: Stack, make_token: Callable[..., str], own_redis: EmbeddedRedis
) -> None:
    client = start(stack, make_token, gpus=2)
    first = client.post("/api/jobs", json=JOB).json()["id"]
    wait_step(client, first, 50)
    worker = stack.processes["worker-lab-a"]
    worker.send_signal(signal.SIGSTOP)  # it cannot take the next launch off the queue
    try:
        second = client.post("/api/jobs", json={**JOB, "hyperparameters": {**JOB["hyperparameters"], "steps": 200}})
        wait_for(lambda: job_of(client, second.json()["id"])["state"] == "dispatched", 30, "the second dispatch")
        server = redis.Redis.from_url(own_redis.url)
        # the state commits just before the message is sent: a flush between the two loses nothing
        wait_for(lambda: launches.pending(server, second.json()["id"], 1), 30, "the second launch message")
        server.flushall()  # its launch message is gone
    finally:
        worker.send_signal(signal.SIGCONT)
    jobs = [wait_state(client, i, FINAL, 300) for i in (first, second.json()["id"])]
    assert [j["state"] for j in jobs] == ["succeeded", "succeeded"], [j["error"] for j in jobs]
    for job in jobs:
        assert job["attempts"] == 1
        assert_ran_once_per_attempt(job)
    assert f"launch of job {second.json()['id']} attempt 1 was lost" in stack.logs["scheduler"].read_text()


def test_a_restarted_redis_is_found_again_by_every_process(
    stack: Stack, make_token: Callable[..., str], own_redis: EmbeddedRedis
) -> None:
    client = start(stack, make_token, gpus=1)
    first = client.post("/api/jobs", json=JOB).json()["id"]
    wait_step(client, first, 50)
    own_redis.stop()
    own_redis.start()
    second = client.post("/api/jobs", json={**JOB, "hyperparameters": {**JOB["hyperparameters"], "steps": 200}}).json()
    jobs = [wait_state(client, i, FINAL, 300) for i in (first, second["id"])]
    assert [j["state"] for j in jobs] == ["succeeded", "succeeded"], [j["error"] for j in jobs]
    for job in jobs:
        assert job["attempts"] == 1
        assert_ran_once_per_attempt(job)
