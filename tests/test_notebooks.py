"""Notebook sessions: a real JupyterLab on a job's GPUs in the sandbox, reached only through
towerq's API with the member's login, ended when idle, its member's folder kept."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from service.core.settings import Settings
from tests.notebook_kernel import run_code, start_kernel, wait_ready, xsrf_headers
from tests.stack import Stack, finished, wait_for

pytestmark = pytest.mark.slow

PROBE = """
import os
for path in {paths!r}:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(1)
        print("READ", path)
    except OSError as err:
        print("DENIED", type(err).__name__)
"""
NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def start_stack(stack: Stack) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, sandbox="bwrap", trainer_pool=0)


def open_session(client: httpx.Client, **spec: Any) -> int:
    created = client.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1, **spec})
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["url"] == f"/sessions/{job['id']}/lab" and job["name"] == "notebook"
    return int(job["id"])


def test_a_session_runs_jupyterlab_on_its_gpu_for_its_owner_only_and_ends_when_idle(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    start_stack(stack)
    alice_token, bob_token = make_token("alice"), make_token("bob")
    alice, bob = stack.client(alice_token), stack.client(bob_token)
    wait_for(lambda: alice.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    job_id = open_session(alice, idle_timeout_s=20)
    wait_ready(alice, job_id)
    detail = alice.get(f"/api/jobs/{job_id}").json()
    assert detail["state"] == "running" and detail["spec"]["idle_timeout_s"] == 20

    # only its owner (and admins) get in; nobody without a login
    assert bob.get(f"/sessions/{job_id}/api/status").status_code == 403
    assert httpx.get(f"{stack.api_url}/sessions/{job_id}/api/status").status_code == 401
    admin = stack.client(make_token("root", admin=True))
    assert admin.get(f"/sessions/{job_id}/api/status").status_code == 200

    # a kernel runs on the session's one GPU, as the lab's Python, in the member's folder
    kernel = start_kernel(alice, job_id)
    printed = run_code(
        alice, str(stack.api_url), alice_token, job_id, kernel,
        "import os, sys; print(os.environ['CUDA_VISIBLE_DEVICES'], os.getcwd(), os.environ['HOME'])",
    )  # fmt: skip
    gpu, cwd, home = printed.split()
    assert gpu == detail["cuda_visible_devices"] and cwd == home == "/home/towerq", printed

    # ... inside the walls: not towerq's database, state or another job's folder
    other = settings.artifacts_dir / "job-999"
    other.mkdir()
    (other / "secret.txt").write_text("bob's")
    database = make_url(settings.database_url).database
    probes = [str(database), str(other / "secret.txt"), str(settings.var_dir), str(settings.artifacts_dir)]
    walls = run_code(alice, str(stack.api_url), alice_token, job_id, kernel, PROBE.format(paths=probes))
    assert "READ" not in walls and walls.count("DENIED") == len(probes), walls

    # a notebook saved now is there in the next session
    saved = alice.put(
        f"/sessions/{job_id}/api/contents/kept.ipynb",
        json={"type": "notebook", "format": "json", "content": NOTEBOOK},
        headers=xsrf_headers(alice, job_id),
    )
    assert saved.status_code in (200, 201), saved.text
    alice.delete(f"/sessions/{job_id}/api/kernels/{kernel}", headers=xsrf_headers(alice, job_id))
    alice.cookies.clear()

    # nobody connected, no kernel busy: it ends by itself, its GPU free for the next job
    job = finished(alice, job_id, timeout=120)
    assert job["state"] == "succeeded", job
    assert "idle for" in job["events"][-1]["message"], job["events"][-1]
    assert alice.get(f"/sessions/{job_id}/api/status").status_code == 409

    second = open_session(alice, gpus=[int(detail["cuda_visible_devices"])])
    wait_ready(alice, second)
    listed = alice.get(f"/sessions/{second}/api/contents").json()
    assert "kept.ipynb" in [item["name"] for item in listed["content"]]

    # the service stopped (Ctrl+C): the session ends, it is not queued again
    stack.stop("worker-lab-a", signal.SIGINT)
    ended = finished(alice, second, timeout=60)
    assert ended["state"] == "cancelled" and "the session ended" in ended["events"][-1]["message"], ended
