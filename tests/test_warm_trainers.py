"""Warm trainers (worker/pool.py), through real processes: a job takes the trainer the
pool started before it was submitted, sees only its own GPUs, is served once and never
again, and the pool warms the next one; in the sandbox jobs start cold; `TOWERQ_TRAINER_POOL=0` starts
none; a warm trainer that died is replaced; stopping the worker leaves no
trainer behind."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import httpx
import pytest

from service.settings import Settings
from tests.stack import Stack, wait_for
from worker.processes import all_processes
from worker.trainer.paths import MODEL_FILE, job_folder

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")
JOB = {
    "model": "mlp",
    "dataset": "digits",
    "gpus": [1],
    "hyperparameters": {"steps": 6, "batch_size": 8, "log_every": 2, "eval_every": 0, "checkpoint_every": 0},
}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def warm_pids(workdir_marker: str) -> dict[int, int]:
    """The warm trainers' Python processes of this test (bwrap's child, in the sandbox), with
    their parents (bwrap, or the worker)."""
    found = {}
    for process in all_processes():
        try:
            with open(f"/proc/{process.pid}/cmdline", "rb") as raw:
                argv = raw.read().split(b"\0")
            cwd = os.readlink(f"/proc/{process.pid}/cwd")
        except OSError:
            continue
        if b"worker.trainer" in argv and b"--warm" in argv and argv[0] != b"bwrap" and workdir_marker in cwd:
            found[process.pid] = process.ppid
    return found


def ready(client: httpx.Client) -> int:
    workers = client.get("/api/workers").json()
    return workers[0]["info"].get("warm_trainers", 0) if workers else 0


def finished(client: httpx.Client, job_id: int) -> dict:
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "job", 0.5)
    assert job["state"] == "succeeded", job["error"]
    return job


def start(stack: Stack, token: str, **worker_env: object) -> httpx.Client:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, heartbeat_interval_s=0.3, **worker_env)
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    return client


@pytest.mark.parametrize("sandbox", ["none"])
def test_a_job_takes_the_warm_trainer_once_and_the_pool_warms_the_next(
    stack: Stack, settings: Settings, make_token: Callable[..., str], sandbox: str
) -> None:
    client = start(stack, make_token(), sandbox=sandbox)
    marker = str(settings.artifacts_dir.resolve().parent)
    wait_for(lambda: ready(client) == 1, 120, "a warm trainer", 0.3)
    before = warm_pids(marker)
    assert len(before) == 1, before

    job = finished(client, client.post("/api/jobs", json=JOB).json()["id"])
    assert job["cuda_visible_devices"] == "1"  # as the trainer itself reported it
    log = client.get(f"/api/jobs/{job['id']}/logs.txt").text
    ((pid, parent),) = before.items()
    started_as = parent if sandbox == "bwrap" else pid  # the process warmed before the submit
    assert f"runs in a warm trainer from the pool, pid {started_as}" in log, log[-3000:]
    folder = job_folder(settings.artifacts_dir, job["id"])
    assert (folder / MODEL_FILE).is_file() and (folder / "checkpoints").is_dir()
    assert not list((settings.artifacts_dir / ".warm").glob("*")) or sandbox == "bwrap"

    wait_for(lambda: ready(client) == 1, 120, "the next warm trainer", 0.3)
    after = warm_pids(marker)
    assert len(after) == 1 and not after.keys() & before.keys(), (before, after)  # a new process, never the same one

    stack.stop("worker-lab-a")
    assert not warm_pids(marker), "a warm trainer outlived its worker"
    assert not list((settings.artifacts_dir / ".warm").glob("*")), "a warm trainer's folder was left behind"
    client.close()


def test_in_the_sandbox_jobs_start_cold_and_no_trainer_waits(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A sandboxed trainer's view is fixed when it starts; until it can show the job's own
    folder path, sandboxed jobs start cold and the pool keeps nobody waiting."""
    client = start(stack, make_token(), sandbox="bwrap")
    job = finished(client, client.post("/api/jobs", json=JOB).json()["id"])
    assert "runs in a new trainer (cold start)" in client.get(f"/api/jobs/{job['id']}/logs.txt").text
    assert not warm_pids(str(settings.artifacts_dir.resolve().parent)) and ready(client) == 0
    client.close()


def test_no_pool_starts_no_warm_trainer_and_a_dead_one_is_replaced(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    token = make_token()
    marker = str(settings.artifacts_dir.resolve().parent)
    client = start(stack, token, trainer_pool=0)
    finished(client, client.post("/api/jobs", json=JOB).json()["id"])
    assert not warm_pids(marker) and ready(client) == 0
    stack.stop("worker-lab-a")

    stack.start_worker("lab-a", 2, heartbeat_interval_s=0.3, sandbox="none")
    wait_for(lambda: ready(client) == 1, 120, "a warm trainer", 0.3)
    (dead,) = warm_pids(marker).keys()
    os.kill(dead, signal.SIGKILL)
    replaced = wait_for(lambda: (p := warm_pids(marker)) and dead not in p and ready(client) == 1 and p, 120, "another")
    job = finished(client, client.post("/api/jobs", json=JOB).json()["id"])
    log = client.get(f"/api/jobs/{job['id']}/logs.txt").text
    assert f"attempt 1 runs in a warm trainer from the pool, pid {next(iter(replaced))}" in log, log
    client.close()
