"""Several GPU hosts: two real workers with different names on this machine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
QUICK = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 60, "batch_size": 16, "log_every": 20}}
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_jobs_spread_over_two_hosts_and_a_bound_job_goes_only_to_its_host(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2)
    stack.start_worker("lab-b", 2)
    client = stack.client(make_token("alice"))
    wait_for(lambda: len(client.get("/api/workers").json()) == 2, 30, "both workers to register")

    spread = [client.post("/api/jobs", json={**QUICK, "gpu_count": 2}).json()["id"] for _ in range(2)]
    # Only once both are placed: a fresh one-GPU job would otherwise go first (smaller gangs
    # lead among fresh jobs) and leave no host with two free GPUs for the second.
    wait_for(lambda: all(client.get(f"/api/jobs/{i}").json()["allocation"] for i in spread), 60, "both placed")
    bound = client.post("/api/jobs", json={**QUICK, "host": "lab-b", "gpus": [1]}).json()["id"]
    jobs = {
        i: wait_for(
            lambda i=i: (j := client.get(f"/api/jobs/{i}").json())["state"] in FINAL and j, 240, f"job {i}", 0.5
        )
        for i in [*spread, bound]
    }
    assert all(j["state"] == "succeeded" for j in jobs.values()), {i: j["error"] for i, j in jobs.items()}
    assert {jobs[i]["allocation"]["host"] for i in spread} == {"lab-a", "lab-b"}
    assert jobs[bound]["allocation"]["host"] == "lab-b" and jobs[bound]["allocation"]["gpus"] == [1]
    workers = {w["name"]: w for w in client.get("/api/workers").json()}
    assert workers["lab-a"]["state"] == workers["lab-b"]["state"] == "up"
    assert workers["lab-b"]["simulated"] is True and workers["lab-b"]["gpus"] == 2
