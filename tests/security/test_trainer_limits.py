"""A trainer's processes live in a cgroup of their attempt (worker/cgroups.py): what it
leaves behind dies with it even without the sandbox, and its memory and process count are
bounded, the limit named in the job's log and error when hit. Before, a `setsid()` child of
an unsandboxed trainer outlived its job, and a trainer could take all of the host's memory
or fork without end."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for
from worker.cgroups import hierarchies
from worker.processes import all_processes

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

GREEDY = """
import subprocess

import keras
import numpy as np


def build(params):
    options = params["model_options"]
    if options["escape"]:
        subprocess.Popen(["sleep", options["escape"]], start_new_session=True)
    children = [subprocess.Popen(["sleep", "30"]) for _ in range(options["children"])]
    hoard = np.ones(options["megabytes"] * 2**17)  # 8 bytes each: touched, so really held
    print("held", hoard.nbytes // 2**20, "MB beside", len(children), "children", flush=True)
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    if not any(h.controller in ("", "pids") for h in hierarchies()):
        pytest.skip("no writable cgroup hierarchy here: the worker runs trainers without one (said in the job's log)")
    (make_settings(sqlite_url).models_path / "greedy.py").write_text(GREEDY)
    return make_settings(sqlite_url)


def run(client: httpx.Client, **options: object) -> tuple[dict, str]:
    spec = {
        "model": "greedy:build",
        "dataset": "digits",
        "gpus": [0],
        "hyperparameters": {"steps": 3, "batch_size": 8, "model_options": options},
    }
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 0.5)
    return job, client.get(f"/api/jobs/{job_id}/logs.txt").text


def escapees(marker: str) -> list[int]:
    return [p.pid for p in all_processes() if p.state != "Z" and p.cmdline == f"sleep {marker}"]


def test_an_unsandboxed_trainer_leaves_nothing_behind(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, sandbox="none", trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    marker = f"{4000 + time.time() % 1000:.3f}"
    job, log = run(client, escape=marker, children=0, megabytes=1)
    assert job["state"] == "succeeded", (job["error"], log[-2000:])
    assert "limits: memory" in log
    wait_for(lambda: not escapees(marker), 10, "the setsid() child to die with its attempt's cgroup")
    client.close()


def test_memory_and_processes_are_bounded_and_named_when_hit(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_pool=0, trainer_memory_mb=1800, trainer_max_processes=120)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    job, log = run(client, escape="", children=0, megabytes=3000)
    assert job["state"] == "failed" and "memory limit of 1800 MB" in job["error"], (job["error"], log[-2000:])
    job, log = run(client, escape="", children=150, megabytes=1)
    assert job["state"] == "failed" and "process limit of 120" in job["error"], (job["error"], log[-2000:])
    assert client.get("/api/jobs").status_code == 200
    client.close()


FILLER = """
import time

import keras


def build(params):
    with open("filler.bin", "wb") as out:  # in the job's folder, its working folder
        out.write(b"x" * 3_000_000)
    with open("sparse.bin", "wb") as out:  # a terabyte that takes no disk: not counted
        out.truncate(2**40)
    time.sleep(3)  # the worker measures every second here
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


def test_a_job_that_fills_its_folder_past_the_limit_is_stopped_and_says_why(
    stack: Stack, make_settings: Callable[..., Settings], sqlite_url: str, make_token: Callable[..., str]
) -> None:
    (make_settings(sqlite_url).models_path / "filler.py").write_text(FILLER)
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_pool=0, job_folder_max_bytes=2_000_000, job_folder_check_s=1)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    spec = {"model": "filler:build", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 3}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 0.5)
    assert job["state"] == "failed", job
    assert "over the 2.0 MB a job folder may take (TOWERQ_JOB_FOLDER_MAX_BYTES)" in job["error"], job["error"]
    assert job["folder_bytes"] >= 3_000_000
    assert "TOWERQ_JOB_FOLDER_MAX_BYTES" in client.get(f"/api/jobs/{job_id}/logs.txt").text
    client.close()
