"""Cancel, time limit, worker shutdown: the trainer's whole process group goes, the GPU is
given back only once the trainer is gone, and the job ends with its reason in words."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from tests.faults.helpers import (
    FINAL,
    assert_metrics_continuous,
    backdate_allocations,
    job_of,
    pid_alive,
    trainer_pids,
    wait_state,
    wait_step,
)
from tests.stack import LOOP, Stack, load_stretch, upload_code, wait_for
from towerq.contract.times import limit_text

pytestmark = pytest.mark.slow
LONG = {
    "model": "mlp",
    "dataset": "digits",
    "gpus": [0],
    # Never ends on its own within a test: 100,000 steps of the digits MLP ended within two
    # minutes, while the second job's trainer was still starting on a loaded machine
    # (test_worker_shutdown_... found the first job succeeded).
    "hyperparameters": {"steps": 10_000_000, "batch_size": 16, "log_every": 10, "checkpoint_every": 500},
}


def trainer_pid(job: dict) -> int:
    message = next(e["message"] for e in reversed(job["events"]) if e["state"] == "running")
    return int(message.split()[1])


def start(stack: Stack, make_token: Callable[..., str], heartbeat_timeout_s: float = 3.0, **worker_env: object):
    stack.start_api()
    stack.start_scheduler(heartbeat_timeout_s=heartbeat_timeout_s)
    stack.start_worker("lab-a", 2, **worker_env)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register")
    return client


def warm(client) -> None:  # type: ignore[no-untyped-def]
    """Until the worker has a warm trainer ready: a job then trains within seconds, however
    slowly this machine loads TensorFlow today (a cold start took 8.5 s)."""
    workers = lambda: client.get("/api/workers").json()  # noqa: E731
    wait_for(lambda: any(w["info"].get("warm_trainers", 0) for w in workers()), 120, "a warm trainer")


def test_cancel_checkpoints_stops_the_trainer_and_frees_the_gpu(stack: Stack, make_token: Callable[..., str]) -> None:
    client = start(stack, make_token)
    job = client.post("/api/jobs", json=LONG).json()
    running = wait_step(client, job["id"], 30)
    pid = trainer_pid(running)
    gpus = {g["index"]: g for g in client.get("/api/gpus").json()}
    assert gpus[0]["holders"][0]["job_id"] == job["id"]
    assert [p["pid"] for p in gpus[0]["processes"]] == [pid], "the GPU lists the trainer as its process"

    assert client.post(f"/api/jobs/{job['id']}/cancel").json()["cancel_requested"] is True
    done = wait_state(client, job["id"], FINAL, 60)
    assert not pid_alive(pid), "when the job is cancelled its trainer is already gone"
    assert done["state"] == "cancelled"
    assert done["events"][-1]["message"] == "cancelled by alice"
    logs = [line["message"] for line in client.get(f"/api/jobs/{job['id']}/logs").json()]
    assert any(m.startswith("trainer stopped at step") for m in logs), "it checkpointed first"
    assert client.get("/api/gpus").json()[0]["holders"] == []


def test_a_cancel_after_the_last_step_leaves_the_job_succeeded(stack: Stack, make_token: Callable[..., str]) -> None:
    """The last step trained, the trainer evaluates, saves and exports (here a large test
    split makes that take seconds) when the cancel arrives: too late to matter, so the job
    ends succeeded with its model, not cancelled with its work done. (The worker's grace is
    long here: this machine's evaluation of the large split outlasted the default 30 s, and
    the kill after the grace is another rule.)"""
    client = start(stack, make_token, cancel_grace_s=300)
    spec = {
        "model": "lenet5",
        "dataset": "synthetic",
        "dataset_options": {"shape": [12, 12, 3], "train_examples": 200, "test_examples": 200_000},
        "gpus": [0],
        "hyperparameters": {"steps": 20, "batch_size": 8, "log_every": 20, "eval_every": 0},
    }
    job = client.post("/api/jobs", json=spec).json()
    wait_step(client, job["id"], 20, 120)
    assert client.post(f"/api/jobs/{job['id']}/cancel").json()["cancel_requested"] is True
    done = wait_state(client, job["id"], FINAL, 120)
    logs = [line["message"] for line in client.get(f"/api/jobs/{job['id']}/logs").json()]
    assert done["state"] == "succeeded", (done["events"], logs[-5:])
    assert any("exported the trained model" in m for m in logs)
    assert client.get("/api/gpus").json()[0]["holders"] == []


def test_a_job_over_its_time_limit_is_stopped_and_fails_saying_so(stack: Stack, make_token: Callable[..., str]) -> None:
    client = start(stack, make_token)
    warm(client)  # it trains before its limit: the limit is said with its step
    limit = round(8 * load_stretch())  # a busy machine's warm trainer took over 8 s to its first step
    job = client.post("/api/jobs", json={**LONG, "time_limit_s": limit}).json()
    done = wait_state(client, job["id"], FINAL, 120)
    assert done["state"] == "failed"
    assert done["error"].startswith(f"time limit of {limit_text(limit)} reached at step "), done["error"]
    assert not pid_alive(trainer_pid(done))
    assert client.get("/api/gpus").json()[0]["holders"] == []


def test_a_running_jobs_time_limit_is_changed_and_it_stops_at_the_new_one(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """`towerq update --time-limit` of a running job (before, 409: only while queued): its
    owner may not lengthen it, an admin may, and the runner follows each change within a
    second; shortened below the time it has run, it stops at once, failed by its limit."""
    client = start(stack, make_token, sandbox="bwrap", trainer_pool=0)
    code = upload_code(client, {"loop.py": LOOP})
    spec = {"command": ["python", "loop.py"], "code": code, "gpu_count": 1, "time_limit_s": 3600}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    pid = trainer_pid(wait_step(client, job_id, 1, 60))
    root = {"Authorization": f"Bearer {make_token('root', True)}"}

    longer = client.patch(f"/api/jobs/{job_id}", json={"time_limit_s": 7200})
    assert longer.status_code == 403, longer.text
    assert longer.json()["detail"] == (
        f"job {job_id} is running: only an admin lengthens a started job's time limit (1h); its owner may shorten it"
    )
    lengthened = client.patch(f"/api/jobs/{job_id}", json={"time_limit_s": 7200}, headers=root)
    assert lengthened.status_code == 200, lengthened.text
    assert lengthened.json()["spec"]["time_limit_s"] == 7200
    assert lengthened.json()["events"][-1]["message"] == "time limit 1h → 2h by root"
    said = "time limit changed to 2h (was 1h), counted from the attempt's start"
    logs = lambda: [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]  # noqa: E731
    wait_for(lambda: said in logs(), 10, "the runner to take the new limit")

    shortened = client.patch(f"/api/jobs/{job_id}", json={"time_limit_s": 1})
    assert shortened.status_code == 200, shortened.text
    done = wait_state(client, job_id, FINAL, 60)
    assert done["state"] == "failed"
    assert done["error"].startswith("time limit of 1s reached at step "), done["error"]
    assert "time limit changed to 1s (was 2h), counted from the attempt's start" in logs()
    assert not pid_alive(pid)
    late = client.patch(f"/api/jobs/{job_id}", json={"time_limit_s": 60}, headers=root)
    assert (
        late.status_code == 409 and late.json()["detail"] == f"job {job_id} is failed: its time limit no longer changes"
    )


def test_worker_shutdown_stops_every_trainer_and_requeues_its_jobs(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    # the lab's timeout, not the faults' 3 s: a clean run's worker missed 3.5 s of heartbeats
    # while its two trainers loaded TensorFlow beside another test, and its jobs were requeued
    # as lost before the shutdown this is about
    client = start(stack, make_token, heartbeat_timeout_s=30.0)
    ids = [client.post("/api/jobs", json={**LONG, "gpus": [i]}).json()["id"] for i in (0, 1)]
    pids = [trainer_pid(wait_step(client, i, 30)) for i in ids]
    assert stack.stop("worker-lab-a", signal.SIGTERM) == 0
    assert not any(pid_alive(p) for p in pids)
    assert not trainer_pids() & set(pids)
    for job_id in ids:
        job = job_of(client, job_id)
        assert (job["state"], job["attempts"], job["crashes"]) == ("queued", 2, 0)
        assert job["events"][-1]["message"] == "worker on lab-a shut down"
    assert {w["name"]: w["state"] for w in client.get("/api/workers").json()} == {"lab-a": "down"}


SLOW_TO_STOP = """
import signal, sys, time
import towerq

def checkpoint(signum, frame):
    time.sleep(3)  # a large model's checkpoint: the worker's shutdown waits for it
    sys.exit(0)

signal.signal(signal.SIGTERM, checkpoint)
step = 0
while True:
    step += 1
    towerq.report(step=step, loss=1.0 / step)
    time.sleep(0.2)
"""


def test_more_signals_during_the_worker_shutdown_do_not_cut_it_short(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """`towerq up`'s Ctrl+C reaches its worker twice: the terminal's SIGINT, then the
    supervisor's SIGTERM, over a second later on a busy machine (and a person may press
    Ctrl+C again). RQ took a signal more than a second after the first as a cold shutdown and
    raised SystemExit wherever the worker's own shutdown was: its job was never requeued, or
    the worker hung at exit until `towerq up` killed it a minute later (CI saw the minute)."""
    client = start(stack, make_token, sandbox="bwrap", trainer_pool=0)
    spec = {"command": ["python", "slow.py"], "code": upload_code(client, {"slow.py": SLOW_TO_STOP}), "gpu_count": 1}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    pid = trainer_pid(wait_step(client, job_id, 1, 60))
    worker = stack.processes["worker-lab-a"]
    worker.send_signal(signal.SIGINT)
    for _ in range(3):  # while the program checkpoints, from after the second RQ let pass
        time.sleep(0.6)
        worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0, stack.dump_logs()
    job = job_of(client, job_id)
    assert (job["state"], job["attempts"], job["crashes"]) == ("queued", 2, 0)
    assert job["events"][-1]["message"] == "worker on lab-a shut down"
    said = stack.logs["worker-lab-a"].read_text()
    assert "got SIGTERM while stopping: it goes on (1 job left to checkpoint and requeue)" in said, said
    assert not pid_alive(pid)


def test_time_slicing_stops_a_long_job_for_fresh_work_and_it_resumes_from_its_checkpoint(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    client = start(stack, make_token)
    long_spec = {**LONG, "hyperparameters": {**LONG["hyperparameters"], "steps": 1200}}
    long = client.post("/api/jobs", json=long_spec).json()["id"]
    first_pid = trainer_pid(wait_step(client, long, 100, 60))
    # As if it had run two hours on its GPU: past its one-GPU-hour slice and the 10-minute floor.
    backdate_allocations(stack.settings.database_url, long, 2)
    short = client.post("/api/jobs", json={**long_spec, "hyperparameters": {"steps": 30, "batch_size": 16}}).json()

    assert wait_state(client, short["id"], FINAL, 120)["state"] == "succeeded"
    done = wait_state(client, long, FINAL, 180)
    assert not pid_alive(first_pid)
    assert done["state"] == "succeeded", done["error"]
    assert (done["attempts"], done["crashes"]) == (2, 0)
    requeued = [e["message"] for e in done["events"] if e["state"] == "queued"][-1]
    assert requeued.startswith("had its time slice (2.0 GPU-hours so far)"), requeued
    assert f"to make room for job {short['id']}" in requeued
    logs = [line["message"] for line in client.get(f"/api/jobs/{long}/logs", params={"tail": 5000}).json()]
    resumed = [int(m.rsplit(" ", 1)[1]) for m in logs if "resumed from the checkpoint of step" in m]
    assert len(resumed) == 1 and resumed[0] >= 100, "it checkpointed when stopped, not only every 500 steps"
    assert f"attempt 2 resumed from the checkpoint of step {resumed[0]}" in logs  # which attempt, said
    assert_metrics_continuous(client, long, 10, 1200)
