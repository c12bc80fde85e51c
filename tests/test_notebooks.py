"""Notebook sessions: a real JupyterLab on a job's GPUs in the sandbox, reached only through
towerq's API with the member's login, ended when idle, its member's folder kept."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from service.core.settings import Settings
from tests.notebook_kernel import run_code, start_kernel, wait_ready, xsrf_headers
from tests.stack import Stack, finished, wait_for
from tests.test_command_jobs import towerq_cli

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
    # a member's notebook folder of at most 1 MB, measured every second
    stack.start_worker(
        "lab-a", 2, sandbox="bwrap", trainer_pool=0, notebook_home_max_bytes=1_000_000, job_folder_check_s=1
    )


def open_session(client: httpx.Client, **spec: Any) -> int:
    created = client.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1, **spec})
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["url"] == f"/sessions/{job['id']}/lab" and job["name"] == "notebook"
    return int(job["id"])


def test_a_session_runs_jupyterlab_on_its_gpu_for_its_owner_only_and_ends_when_idle(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
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

    # the API restarts under the open session: the proxy kept nothing, the kernel is reached again
    stack.stop("api")
    stack.start_api()
    alice, bob = stack.client(alice_token), stack.client(bob_token)
    assert run_code(alice, str(stack.api_url), alice_token, job_id, kernel, "print(6 * 7)").strip() == "42"

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

    # `towerq notebook` queues the next one, waits until it answers and says where it is
    gpu_id = detail["cuda_visible_devices"]
    done = towerq_cli("notebook", "--gpu-ids", gpu_id, cwd=tmp_path, api=str(stack.api_url), token=alice_token)
    assert done.returncode == 0, done.stdout + done.stderr
    ready = next(line for line in done.stdout.splitlines() if " is ready: " in line)
    second = int(ready.split()[1])
    assert ready.endswith(f"{stack.api_url}/sessions/{second}/lab"), done.stdout
    assert alice.get(f"/sessions/{second}/api/status").status_code == 200
    listed = alice.get(f"/sessions/{second}/api/contents").json()
    assert "kept.ipynb" in [item["name"] for item in listed["content"]]

    # past its quota the member's folder stops the session; what it holds stays
    kernel = start_kernel(alice, second)
    run_code(alice, str(stack.api_url), alice_token, second, kernel, "open('big.bin', 'wb').write(b'x' * 3_000_000)")
    full = finished(alice, second, timeout=60)
    assert full["state"] == "failed" and "your notebook folder grew to" in full["error"], full
    # a session that names a code bundle imports from it, from the folders its own env adds, and
    # towerq; its Python processes write whole lines (towerq's sitecustomize), as a command job's
    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    (project / "helpers.py").write_text("ANSWER = 42\n")
    (project / "lib" / "extra.py").write_text("WORD = 'hi'\n")
    done = towerq_cli(
        "notebook", "--code", "project", "--env", "PYTHONPATH=/code/lib",
        cwd=tmp_path, api=str(stack.api_url), token=alice_token,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    third = int(next(line for line in done.stdout.splitlines() if " is ready: " in line).split()[1])
    names = [item["name"] for item in alice.get(f"/sessions/{third}/api/contents").json()["content"]]
    assert {"kept.ipynb", "big.bin"} <= set(names), names
    kernel = start_kernel(alice, third)
    imported = run_code(
        alice, str(stack.api_url), alice_token, third, kernel,
        "import helpers, extra, towerq, os, sitecustomize\n"
        "print(helpers.ANSWER, extra.WORD, towerq.__name__, os.environ['TOWERQ_CODE_DIR'])\n"
        "print(os.path.basename(os.path.dirname(sitecustomize.__file__)))",
    )  # fmt: skip
    assert imported.split() == ["42", "hi", "towerq", "/code", "program_site"], imported
    second = third

    # the service stopped (Ctrl+C): the session ends, it is not queued again
    stack.stop("worker-lab-a", signal.SIGINT)
    ended = finished(alice, second, timeout=60)
    assert ended["state"] == "cancelled" and "the session ended" in ended["events"][-1]["message"], ended


def test_a_sessions_spec_and_the_labs_caps_are_checked_at_submit(
    stack: Stack, settings: Settings, make_token: Callable[..., str], add_host: Callable[..., None]
) -> None:
    stack.start_api(
        notebook_max_per_member=1, notebook_max_gpus=2, notebook_max_idle_timeout_s=600, notebook_max_time_limit_s=7200
    )
    add_host("lab-a", 4)
    alice, bob = stack.client(make_token("alice")), stack.client(make_token("bob"))
    for spec, field in (
        ({"kind": "notebook", "model": "mlp"}, "model"),
        ({"kind": "notebook", "command": ["python"]}, "model"),
        ({"kind": "notebook", "resumable": True}, "resumable"),
        ({"kind": "notebook", "idle_timeout_s": 3}, "idle_timeout_s"),
        ({"kind": "notebook", "idle_timeout_s": 3600}, "idle_timeout_s"),
        ({"kind": "notebook", "gpu_count": 8}, "gpu_count"),
        ({"kind": "notebook", "time_limit_s": 7201}, "TOWERQ_NOTEBOOK_MAX_TIME_LIMIT_S"),
        ({"model": "mlp", "dataset": "digits", "idle_timeout_s": 60}, "idle_timeout_s"),
    ):
        refused = alice.post("/api/jobs", json=spec)
        assert refused.status_code == 422, (spec, refused.text)
        assert field in refused.text, (spec, refused.text)
    first = alice.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1})
    assert first.status_code == 201 and first.json()["spec"]["idle_timeout_s"] == 600  # the lab's default, capped
    assert first.json()["spec"]["time_limit_s"] == 7200  # the lab's longest, when it names none
    # ... and later too: a queued session's time limit changed past the cap is refused (it was taken)
    longer = alice.patch(f"/api/jobs/{first.json()['id']}", json={"time_limit_s": 7201})
    assert longer.status_code == 422 and "TOWERQ_NOTEBOOK_MAX_TIME_LIMIT_S" in longer.text, longer.text
    shorter = alice.patch(f"/api/jobs/{first.json()['id']}", json={"time_limit_s": 3600})
    assert shorter.status_code == 200 and shorter.json()["spec"]["time_limit_s"] == 3600, shorter.text
    second = alice.post("/api/jobs", json={"kind": "notebook"})
    assert second.status_code == 429 and "TOWERQ_NOTEBOOK_MAX_PER_MEMBER" in second.text, second.text
    over = bob.post("/api/jobs", json={"kind": "notebook", "gpu_count": 2})
    assert over.status_code == 429 and "TOWERQ_NOTEBOOK_MAX_GPUS" in over.text, over.text
    sweep = {"name": "s", "base": {"kind": "notebook"}, "grid": {"gpu_count": [1]}}
    refused = bob.post("/api/sweeps", json=sweep)
    assert refused.status_code == 422 and "kind" in refused.text, refused.text


def test_a_session_whose_door_cannot_open_is_queued_again_saying_why(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A session's door takes a free port of `TOWERQ_RANK_PORTS` on its host: where none is
    free, the attempt is lost (queued again, counted against `max_attempts`) and the reason
    says so. It said "the worker failed while running this job (see the worker log)"."""
    with socket.socket() as taken:  # the range's one port, listened on by something else
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack.start_api()
        stack.start_scheduler()
        stack.start_worker("lab-a", 1, trainer_pool=0, rank_ports=f"{port}-{port}")
        client = stack.client(make_token("alice"))
        job_id = open_session(client)  # tried the lab's default 3 times
        done = finished(client, job_id, 60)
        said = f": no free port in TOWERQ_RANK_PORTS={port}-{port}; gave up after 3 crashed attempts"
        assert done["state"] == "failed" and done["attempts"] == 3, done
        assert done["error"].startswith("its door could not open on ") and done["error"].endswith(said), done


def test_a_host_that_runs_no_sessions_says_why_at_submit_and_at_start(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """A root worker without the sandbox runs no notebook session: its terminal would be a
    root shell on the host (and JupyterLab refuses root). Its worker says so when it
    registers: where no host that is up runs sessions a submit is refused naming `kind`,
    one naming the host is refused naming `host`, both with the host's reason; a session
    that reached the host anyway (submitted while it was down) fails saying why. Before,
    each was taken, and the session failed with JupyterLab's advice to pass --allow-root."""
    if os.geteuid() != 0:
        pytest.skip("a worker without the sandbox is root only where the tests run as root")
    stack.start_api()
    stack.start_scheduler()
    client = stack.client(make_token("alice"))
    stack.start_worker("lab-a", 1, trainer_pool=0)
    wait_for(lambda: [w["state"] for w in client.get("/api/workers").json()] == ["up"], 60, "lab-a to register")
    stack.stop("worker-lab-a")  # down: a session for it waits
    wait_for(lambda: [w["state"] for w in client.get("/api/workers").json()] == ["down"], 60, "lab-a to go down")
    early = open_session(client, host="lab-a")

    stack.start_worker("lab-a", 1, trainer_pool=0, sandbox="none")
    why = "its worker runs as root without the sandbox (TOWERQ_SANDBOX=none, or no bubblewrap)"
    done = finished(client, early, 60)
    assert done["state"] == "failed" and done["error"].startswith(f"lab-a runs no notebook sessions: {why}"), done
    wait_for(lambda: client.get("/api/workers").json()[0]["info"]["no_notebooks"], 30, "lab-a's word")
    for spec, field in (({}, "kind"), ({"host": "lab-a"}, "host")):
        refused = client.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1, **spec})
        assert refused.status_code == 422, refused.text
        said = refused.json()["detail"][0]["msg"]
        assert said.startswith(f"{field}: ") and why in said and "lab-a" in said, said
