"""A Slurm attempt's claim (`POST /api/attempts/{job}/{attempt}/claim`) names the node the
attempt runs on, and the job's row took it on the claimer's word: the holder of an attempt's
token could say the attempt runs on any node, before Slurm started it or on a node Slurm
never gave it, and that node is where the API's proxy then takes a notebook session's door
and where the job page says it ran. Now the API asks Slurm (`squeue`, on the submit node it
runs on) where the attempt's Slurm job runs, and takes a claim only of that node.

The attacker here holds a fresh token of each attempt (as one who stole it would hold the
executor's): a claim of an attempt Slurm still holds pending, and of a running one on a
node Slurm did not give it, are refused, naming the node, and change nothing; a true claim
is taken. Before the change the first two were taken too. The nodes' runner is slowed (the
cluster's Python is a wrapper that waits) so the attacker claims before it does. And a
runner whose claim the API refuses (here an API set up with another job prefix than the
scheduler's) ends its job saying why. Many claims at once cost Slurm's controller a few
`squeue`s, not one each (a snapshot confirms a claim; what it does not is asked afresh)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service.core.attempts import mint_attempt_token
from service.core.context import Context
from service.core.models import Job
from service.core.settings import Settings
from service.executors.slurm import SlurmError, SlurmExecutor
from tests.on_slurm import cluster, needs_slurm, on_slurm, slurm_job, slurm_settings, wait_state
from tests.slurm_cluster import SlurmCluster
from tests.stack import Stack, upload_code, wait_for

pytestmark = [pytest.mark.slow, needs_slurm]
FIXTURES = (cluster, on_slurm)

SLOW_START_S = 15
"""How long the node's runner waits before it starts (and claims): the attacker's window."""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str, tmp_path: Path) -> Settings:
    made = slurm_settings(make_settings, sqlite_url, tmp_path)
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep {SLOW_START_S}\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    made.slurm_python = str(slow)
    return made


@pytest.fixture
def ctx(settings: Settings) -> Iterator[Context]:
    context = Context.open(settings)
    yield context
    context.close()


def claim(client: httpx.Client, ctx: Context, job_id: int, node: str) -> httpx.Response:
    with ctx.db.write() as session:
        token = mint_attempt_token(session, job_id, 1)
    headers = {"Authorization": f"Bearer {token}"}
    return client.post(f"/api/attempts/{job_id}/1/claim", json={"node": node}, headers=headers)


def counted_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Slurm's own `squeue`, first on this process's PATH behind a line per call in the file returned."""
    real, shim, calls = shutil.which("squeue"), tmp_path / "shim", tmp_path / "squeues"
    assert real is not None
    shim.mkdir()
    calls.touch()
    (shim / "squeue").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} "$@"\n')
    (shim / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    return calls


def refusal(answer: httpx.Response) -> str:
    return str(answer.json()["detail"][0]["msg"])


def node_of(ctx: Context, job_id: int) -> str | None:
    with ctx.db.read() as session:
        return session.scalar(select(Job.host_name).where(Job.id == job_id))


def test_a_claim_names_only_the_node_slurm_runs_the_attempt_on(
    on_slurm: Any,
    cluster: SlurmCluster,
    settings: Settings,
    ctx: Context,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = on_slurm
    squeues = counted_squeue(tmp_path, monkeypatch)
    code = upload_code(client, {"wait.py": "import time\ntime.sleep(600)\n"})
    spec = {"command": ["python", "wait.py"], "code": code}
    running = client.post("/api/jobs", json={**spec, "gpu_count": 4}).json()["id"]
    wait_for(lambda: slurm_job(cluster, settings, running)["state"] == "RUNNING", 30, "Slurm to run it")
    pending = client.post("/api/jobs", json={**spec, "gpu_count": 1}).json()["id"]
    wait_for(lambda: slurm_job(cluster, settings, pending)["state"] == "PENDING", 30, "Slurm to hold it")

    early = claim(client, ctx, pending, cluster.node)
    assert early.status_code == 422 and refusal(early).startswith("node: ") and "pending" in refusal(early), early.text
    assert node_of(ctx, pending) is None

    elsewhere = claim(client, ctx, running, "login-node")
    assert elsewhere.status_code == 422 and refusal(elsewhere).startswith("node: "), elsewhere.text
    assert f"on {cluster.node}" in refusal(elsewhere), elsewhere.text
    assert node_of(ctx, running) is None

    # many claims at once (here asked of the executor itself) cost Slurm's controller a few squeues, not one each
    executor = SlurmExecutor(settings)
    for _ in range(20):
        assert executor.runs_on(running, 1, cluster.node) == cluster.node
        with pytest.raises(SlurmError, match="pending, not running"):
            executor.runs_on(pending, 1, cluster.node)
    assert len(squeues.read_text().splitlines()) <= 3, squeues.read_text()

    true = claim(client, ctx, running, cluster.node)
    assert true.status_code == 200, true.text
    assert node_of(ctx, running) == cluster.node
    for job_id in (running, pending):
        assert client.post(f"/api/jobs/{job_id}/cancel").status_code == 202
    for job_id in (running, pending):
        wait_state(client, job_id, ("cancelled", "failed"), 120)


@pytest.fixture
def misconfigured(
    cluster: SlurmCluster, stack: Stack, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[httpx.Client]:
    """An API whose Slurm job prefix is not the scheduler's (the two set up apart): it finds
    none of the scheduler's Slurm jobs. (Its runner starts slowly too, as the settings say.)"""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    stack.start_api(slurm_job_prefix="elsewhere")
    stack.start_scheduler(api_url=stack.api_url)
    with stack.client(make_token("alice")) as client:
        yield client


def test_a_runner_whose_claim_is_refused_ends_its_job_saying_why(
    misconfigured: httpx.Client, cluster: SlurmCluster, settings: Settings
) -> None:
    client = misconfigured
    code = upload_code(client, {"hello.py": "print('hello')\n"})
    job_id = client.post("/api/jobs", json={"command": ["python", "hello.py"], "code": code}).json()["id"]
    done = wait_state(client, job_id, ("succeeded", "failed", "cancelled"), 120)
    assert (done["state"], done["error"]) == (
        "failed",
        f"node {cluster.node} could not claim it: node: Slurm does not run the attempt: "
        f"Slurm has no job named elsewhere-{job_id}-1",
    )
