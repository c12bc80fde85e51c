"""An adaptive sweep through the whole service (API, scheduler, a worker of simulated GPUs):
command jobs report synthetic learning curves (no training), the scheduler's searcher
stops the settings behind at the rungs, and a stopped setting ends succeeded with the
reason, its GPU freed for the next; the best trains to the end."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, upload_code, wait_for

pytestmark = pytest.mark.slow

CURVE = """
import sys, time
import towerq

quality = float(sys.argv[1])
for step in range(5, 61, 5):
    towerq.report(step=step, accuracy=quality * (1 - 1 / (step + 1)))
    time.sleep(1.0)
"""


def test_an_adaptive_sweep_stops_the_settings_behind_at_the_rungs(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {"curve.py": CURVE})
    body = {
        "name": "curves",
        "base": {"command": ["python", "curve.py", "{quality}"], "code": code, "gpu_count": 1},
        "grid": {"quality": [0.5, 0.9, 0.3, 0.8]},
        "metric": "accuracy",
        "max_parallel": 1,  # one at a time: the order they reach the rungs is the grid's
        "early_stopping": {"min_steps": 10, "reduction_factor": 2, "max_steps": 60},
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
