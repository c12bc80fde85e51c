"""A worker SIGKILLed mid-job: its trainer dies with it, the job goes back to the queue
when the host misses its heartbeats, and resumes from its checkpoint on another host."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from tests.faults.helpers import assert_metrics_continuous, job_of, pid_alive, wait_state, wait_step
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
STEPS = 3000
LONG = {
    "model": "lenet5",
    "dataset": "digits",
    "gpu_count": 2,
    "hyperparameters": {"steps": STEPS, "batch_size": 16, "log_every": 10, "checkpoint_every": 100},
}


def test_killed_worker_s_job_resumes_on_another_host_from_its_checkpoint(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    doomed = stack.start_worker("lab-b", 2)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "lab-b to register")
    job_id = client.post("/api/jobs", json=LONG).json()["id"]
    assert wait_step(client, job_id, 10)["allocation"]["host"] == "lab-b"
    # lab-a starts while the job trains, not after step 350: beside two CPU burners its start
    # once took long enough for the job to train to its end first, and the next attempt then
    # resumed from the final checkpoint with nothing left to train
    stack.start_worker("lab-a", 2)
    wait_for(lambda: len(client.get("/api/workers").json()) == 2, 30, "lab-a to register")
    running = wait_step(client, job_id, 350)
    assert running["step"] < STEPS - 1000, "the job must still train when lab-b dies"

    stack.stop("worker-lab-b", signal.SIGKILL)
    assert doomed.poll() is not None
    wait_for(lambda: job_of(client, job_id)["attempts"] == 2, 30, "the job to be requeued")
    done = wait_state(client, job_id, ("succeeded", "failed", "cancelled"))

    assert done["state"] == "succeeded", done["error"]
    assert (done["attempts"], done["crashes"]) == (2, 1)
    assert done["allocation"]["host"] == "lab-a"
    reasons = [e["message"] for e in done["events"] if e["state"] == "queued"]
    assert reasons[-1] == "host lab-b stopped sending heartbeats"
    workers = {w["name"]: w["state"] for w in client.get("/api/workers").json()}
    assert workers == {"lab-a": "up", "lab-b": "down"}

    points = assert_metrics_continuous(client, job_id, 10, STEPS)
    logs = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 5000}).json()]
    resumed = [int(m.rsplit(" ", 1)[1]) for m in logs if "resumed from the checkpoint of step" in m]
    assert len(resumed) == 1 and resumed[0] >= 300 and resumed[0] % 100 == 0
    assert {p["attempt"] for p in points if p["step"] <= resumed[0]} == {1}, "metrics before the checkpoint are kept"
    assert {p["attempt"] for p in points if p["step"] > resumed[0]} == {2}
    first_pid = int(next(e["message"] for e in done["events"] if e["state"] == "running").split()[1])
    assert not pid_alive(first_pid), "the killed worker's trainer must not survive it"
