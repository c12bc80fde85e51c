"""`peer_lost` (another rank of a job over several hosts stopped answering) puts a job back
in the queue as a crash, to be tried again. The trainer says it on the stdout user code
prints to: a one-host job's model that prints the line and exits must fail as any error
does, not be run again and again on the lab's GPUs.

On a rank of a job over several hosts the line is taken at its word: the job goes back to
the queue at once (a rank torn down slowly under load once held the job 14 s past it). So a
rank whose model says it and trains on must not run on beside the job's next attempt: its
processes are killed at that word, and the GPUs stay held until they are gone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from service.core.models import Job
from service.core.settings import Settings
from tests.ranks import a_rank, lines_of
from tests.stack import Stack, wait_for

FINAL = ("succeeded", "failed", "cancelled")

FORGER = """
import json
import os


def build(params):
    line = {"event": "error", "kind": "peer_lost", "message": "another rank stopped answering"}
    print(json.dumps(line), flush=True)
    os._exit(1)
"""


SAYS_IT_AND_TRAINS_ON = """
import json, sys, time
print("step 80", flush=True)
line = {"event": "error", "kind": "peer_lost", "message": "rank 0: another rank stopped answering"}
print(json.dumps(line), flush=True)
print("still training", file=sys.stderr, flush=True)
for step in range(81, 100000):
    time.sleep(0.01)
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    (make_settings(sqlite_url).models_path / "lost.py").write_text(FORGER)
    return make_settings(sqlite_url)


@pytest.mark.slow
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


def test_a_rank_that_says_its_peer_is_lost_and_trains_on_is_killed_at_that_word(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    with a_rank(settings, add_host, SAYS_IT_AND_TRAINS_ON, 0) as (ctx, runner):
        job_id = runner.launch.job_id

        def job() -> Job:
            with ctx.db.read() as session:
                row = session.get(Job, job_id)
                assert row is not None
                return row

        def supervise_and_end() -> None:
            runner._supervise()
            runner._end()

        began = time.monotonic()
        ending = threading.Thread(target=supervise_and_end, daemon=True)
        ending.start()
        back = wait_for(lambda: (j := job()).state == "queued" and j, 10, "the job back in the queue", 0.05)
        assert (back.attempts, back.crashes) == (2, 1), "a crash of the gang, tried again"
        ending.join(20)
        assert not ending.is_alive() and time.monotonic() - began < 20, "the forger ran on as the job"
        assert runner.process is not None and runner.process.returncode == -9, "killed at its word"
        said = [message for attempt, message in lines_of(ctx, job_id) if attempt == 1]
        assert "[rank 0 on lab-a] rank 0: another rank stopped answering" in said, said
        assert "[rank 0 on lab-a] still training" in said, "its last lines are its attempt's"
