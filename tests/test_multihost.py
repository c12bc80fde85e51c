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


def test_a_job_over_two_hosts_trains_like_one_device_on_the_whole_batch(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    """Through REST: 4 GPUs over two 2-GPU workers (one rank on each, 2 towers each, batch
    b per tower) trains step by step like one GPU on 4b; a job larger than the lab gets a
    422 naming the largest that fits."""
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, worker_address="127.0.0.1", trainer_pool=0)
    stack.start_worker("lab-b", 2, worker_address="127.0.0.1", trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: len(client.get("/api/workers").json()) == 2, 30, "both workers to register")
    refused = client.post("/api/jobs", json={**QUICK, "gpu_count": 6})
    assert refused.status_code == 422 and "4 GPUs (2 hosts of 2)" in refused.text, refused.text
    uneven = client.post("/api/jobs", json={**QUICK, "gpu_count": 3})
    assert uneven.status_code == 422 and "multiple of 2" in uneven.text, uneven.text

    hyper = {"steps": 20, "batch_size": 4, "seed": 3, "log_every": 1, "optimizer": "momentum"}
    gang = client.post("/api/jobs", json={**QUICK, "gpu_count": 4, "hyperparameters": hyper}).json()["id"]
    one = client.post(
        "/api/jobs", json={**QUICK, "gpu_count": 1, "hyperparameters": {**hyper, "batch_size": 16}}
    ).json()["id"]
    jobs = {
        i: wait_for(
            lambda i=i: (j := client.get(f"/api/jobs/{i}").json())["state"] in FINAL and j, 300, f"job {i}", 0.5
        )
        for i in (gang, one)
    }
    assert all(j["state"] == "succeeded" for j in jobs.values()), {i: j["error"] for i, j in jobs.items()}
    ranks = jobs[gang]["allocation"]["ranks"]
    assert [(r["rank"], r["gpus"]) for r in ranks] == [(0, [0, 1]), (1, [0, 1])]
    assert {r["host"] for r in ranks} == {"lab-a", "lab-b"} and jobs[gang]["towers"] == 4
    series = {
        i: [(p["step"], p["loss"]) for p in client.get(f"/api/jobs/{i}/metrics").json() if p["split"] == "train"]
        for i in (gang, one)
    }
    assert [s for s, _ in series[gang]] == list(range(1, 21))
    assert all(abs(a[1] - b[1]) <= 1e-4 * max(1.0, abs(b[1])) for a, b in zip(series[gang], series[one], strict=True))
    lines = [line["message"] for line in client.get(f"/api/jobs/{gang}/logs").json()]
    assert any(m.startswith("[rank 1 on ") for m in lines), lines[-20:]
