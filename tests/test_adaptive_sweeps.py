"""An adaptive sweep through the whole service (API, scheduler, a worker of simulated GPUs):
command jobs report synthetic learning curves (no training), the scheduler's searcher
stops the settings behind at the rungs, and a stopped setting ends succeeded with the
reason, its GPU freed for the next; the best trains to the end; the sweep's webhook says
once, when its last job ended, which setting was best and how many it stopped; the sweep's
page in Chromium says where each setting got to."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, upload_code, wait_for
from tests.test_webhooks import Receiver, receiving

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CURVE = """
import sys, time
import towerq

quality = float(sys.argv[1])
for step in range(5, 61, 5):
    towerq.report(step=step, accuracy=quality * (1 - 1 / (step + 1)))
    time.sleep(1.0)
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(failures=0) as running:
        yield running


@pytest.fixture
def settings(make_settings: Callable[..., Settings], database_url: str, receiver: Receiver) -> Settings:
    return make_settings(database_url, webhook_allow="127.0.0.1", public_url="https://towerq.lab.example")


def test_an_adaptive_sweep_stops_the_settings_behind_at_the_rungs(
    stack: Stack,
    settings: Settings,
    make_token: Callable[..., str],
    receiver: Receiver,
    open_page: Callable[..., Any],
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, trainer_pool=0)
    token = make_token("alice")
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {"curve.py": CURVE})
    body = {
        "name": "curves",
        "base": {"command": ["python", "curve.py", "{quality}"], "code": code, "gpu_count": 1},
        "grid": {"quality": [0.5, 0.9, 0.3, 0.8]},
        "metric": "accuracy",
        "max_parallel": 1,  # one at a time: the order they reach the rungs is the grid's
        "early_stopping": {"min_steps": 10, "reduction_factor": 2, "max_steps": 60},
        "notify_url": f"{receiver.url}/sweep",
    }
    created = client.post("/api/sweeps", json=body)
    assert created.status_code == 201, created.text
    sweep = created.json()
    first, best, worst, second = (job["id"] for job in sweep["jobs"])
    jobs = {job_id: finished(client, job_id, timeout=180) for job_id in (first, best, worst, second)}

    # rung 1 (step 10): 0.5 first, 0.9 best of 2, 0.3 behind both (keep 1 of 3): stopped;
    # 0.8 second of 4 (keep 2) goes on; rung 2 (step 20): 0.8 behind 0.9 (keep 1 of 3): stopped
    assert all(job["state"] == "succeeded" for job in jobs.values()), jobs
    said = {job_id: job["events"][-1]["message"] or "" for job_id, job in jobs.items()}
    assert said[worst].startswith(f"stopped early by sweep {sweep['id']} at rung 1 (step 10): accuracy 0.27"), said
    assert said[second].startswith(f"stopped early by sweep {sweep['id']} at rung 2 (step 20): accuracy 0.76"), said
    assert "stopped early" not in said[first] + said[best]
    assert jobs[first]["step"] == jobs[best]["step"] == 60 and jobs[worst]["step"] < 60 and jobs[second]["step"] < 60
    shown = client.get(f"/api/sweeps/{sweep['id']}").json()
    assert shown["best_job"] == best
    stopped = {(r["job_id"], r["rung"]) for r in shown["rungs"] if r["stopped"]}
    assert stopped == {(worst, 1), (second, 2)}, shown["rungs"]

    # the sweep's own webhook, once, after its last job: the best setting, the two stopped
    wait_for(lambda: any(r["headers"]["X-Towerq-Event"] == "sweep.finished" for r in receiver.posts("/sweep")), 30,
             "the sweep's webhook")  # fmt: skip
    ended = [r for r in receiver.posts("/sweep") if r["headers"]["X-Towerq-Event"] == "sweep.finished"]
    assert len(ended) == 1
    said_sweep = json.loads(ended[0]["body"])["sweep"]
    assert said_sweep["best"]["job_id"] == best and said_sweep["best"]["setting"] == {"quality": 0.9}
    assert said_sweep["stopped_early"] == 2 and said_sweep["counts"] == {"succeeded": 4}
    assert said_sweep["url"] == f"https://towerq.lab.example/#/sweeps/{sweep['id']}"
    assert (
        "best: job" in json.loads(ended[0]["body"])["text"]
        and "2 stopped early" in json.loads(ended[0]["body"])["text"]
    )
    wait_for(lambda: len(receiver.posts("/sweep")) == 5, 30, "each job's webhook to the sweep's URL too")

    # the sweep's page: how many it stopped, and where each setting got to
    page = open_page()
    page.goto(f"{stack.api_url}/?token={token}#/sweeps/{sweep['id']}")
    page.wait_for_selector(f'#sweep-table tr[data-job="{worst}"]')
    summary = page.inner_text("#sweep-summary")
    assert "early stopping (ASHA): rungs from step 10, 1 in 2 goes on · 2 stopped early" in summary, summary
    rung = {job_id: page.inner_text(f'#sweep-table tr[data-job="{job_id}"] td:last-child') for job_id in jobs}
    assert rung == {first: "past 3", best: "past 3", worst: "stopped at 1", second: "stopped at 2"}, rung
