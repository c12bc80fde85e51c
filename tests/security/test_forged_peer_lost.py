"""`peer_lost` (another rank of a job over several hosts stopped answering) puts a job back
in the queue as a crash, to be tried again. The trainer says it on the stdout user code
prints to: a one-host job's model that prints the line and exits must fail as any error
does, not be run again and again on the lab's GPUs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

FORGER = """
import json
import os


def build(params):
    line = {"event": "error", "kind": "peer_lost", "message": "another rank stopped answering"}
    print(json.dumps(line), flush=True)
    os._exit(1)
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    (make_settings(sqlite_url).models_path / "lost.py").write_text(FORGER)
    return make_settings(sqlite_url)


def test_a_one_host_job_that_claims_a_lost_peer_fails_once(stack: Stack, make_token: Callable[..., str]) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    spec = {"model": "lost:build", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 3}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 240, "the job", 0.5)
    assert job["state"] == "failed" and job["attempts"] == 1, (job["state"], job["attempts"], job["error"])
    assert "another rank stopped answering" in job["error"]
