"""A worker paused past the heartbeat timeout (SIGSTOP) loses its jobs, but its trainer
lives on; when it resumes, its host gets no new work on those GPUs until that trainer is
gone, so no GPU ever has two trainers on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import select

from service.core.db import Database
from service.core.models import Allocation
from tests.faults.helpers import job_of, paused_outside_a_write, pid_alive, wait_state, wait_step
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
LONG = {
    "model": "mlp",
    "dataset": "digits",
    "gpus": [0],
    "hyperparameters": {"steps": 10_000_000, "batch_size": 16, "log_every": 10, "checkpoint_every": 200},
}


def first_trainer_pid(job: dict) -> int:
    return int(next(e["message"] for e in job["events"] if e["state"] == "running").split()[1])


def test_a_resumed_worker_gets_no_work_on_a_gpu_until_its_lost_trainer_is_gone(
    stack: Stack, make_token: Callable[..., str], db: Database
) -> None:
    stack.start_api()
    stack.start_scheduler()
    worker = stack.start_worker("lab-a", 1, heartbeat_timeout_s=3)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register")
    job_id = client.post("/api/jobs", json=LONG).json()["id"]
    old_trainer = first_trainer_pid(wait_step(client, job_id, 20))

    died_at: list[float] = []

    def watch() -> None:
        while pid_alive(old_trainer):
            time.sleep(0.005)
        died_at.append(time.time())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with paused_outside_a_write(worker.pid, db.url):
        wait_for(lambda: job_of(client, job_id)["attempts"] == 2, 30, "the paused host's job to be requeued")
        assert pid_alive(old_trainer), "the paused worker's trainer keeps running"
    second = wait_for(
        lambda: (j := job_of(client, job_id))["state"] == "running" and j["attempts"] == 2 and j,
        60,
        "attempt 2 to run",
        0.2,
    )
    watcher.join(30)
    assert died_at, "the lost trainer was killed after the worker resumed"
    with db.read() as session:
        allocated = session.scalars(
            select(Allocation.created_at).where(Allocation.job_id == job_id, Allocation.attempt == 2)
        ).all()
    assert allocated and allocated[0].timestamp() >= died_at[0] - 0.05, (
        f"GPU 0 was given to attempt 2 {died_at[0] - allocated[0].timestamp():.2f}s before the old trainer died"
    )
    assert first_trainer_pid(second) == old_trainer  # the events keep the first attempt's pid
    client.post(f"/api/jobs/{job_id}/cancel")
    wait_state(client, job_id, ("cancelled",))
