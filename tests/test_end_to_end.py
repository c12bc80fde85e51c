"""The whole path through real processes: REST -> scheduler -> RQ -> worker -> trainer ->
metrics in the database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow

SPEC = {"model": "lenet5", "dataset": "digits", "gpus": [0, 1], "hyperparameters": {"steps": 300, "batch_size": 32}}
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def settings(make_settings: Callable[..., object], sqlite_url: str) -> object:
    return make_settings(sqlite_url, api_workers=2)  # the API as deployed: two processes


def finished(client, job_id: int, timeout: float = 240) -> dict:
    return wait_for(
        lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j,
        timeout,
        f"job {job_id} to end",
        0.5,
    )


def test_lenet5_on_two_simulated_gpus_trains_digits_to_90_percent(stack: Stack, make_token: Callable[..., str]) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 4)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")

    created = client.post("/api/jobs", json=SPEC)
    assert created.status_code == 201, created.text
    job = finished(client, created.json()["id"])

    assert job["state"] == "succeeded", job["error"]
    states = [e["state"] for e in job["events"]]
    assert states == ["queued", "dispatched", "running", "succeeded"]
    times = [datetime.fromisoformat(e["time"]) for e in job["events"]]
    assert times == sorted(times)
    assert job["allocation"] == {
        "host": "lab-a",
        "gpus": [0, 1],
        "gpu_uuids": ["SIM-lab-a-0", "SIM-lab-a-1"],
        "fraction": 1.0,
        "simulated": True,
        "ranks": [{"rank": 0, "host": "lab-a", "gpus": [0, 1], "gpu_uuids": ["SIM-lab-a-0", "SIM-lab-a-1"]}],
    }
    assert job["cuda_visible_devices"] == "0,1"
    assert job["towers"] == 2
    assert job["batch_norm"] == {"synchronized": [], "per_tower": []}  # lenet5 has none

    metrics = client.get(f"/api/jobs/{job['id']}/metrics").json()
    train = [m for m in metrics if m["split"] == "train"]
    evals = [m for m in metrics if m["split"] == "eval"]
    assert [m["step"] for m in train] == list(range(10, 301, 10))
    assert sum(m["loss"] for m in train[-5:]) / 5 < 0.5 * sum(m["loss"] for m in train[:5]) / 5
    assert evals[-1]["step"] == 300
    assert evals[-1]["accuracy"] >= 0.9
    assert job["latest"]["eval_accuracy"] == evals[-1]["accuracy"]
    assert client.get("/api/gpus").json()[0]["holders"] == []  # allocation freed

    # The log says what happened, not TensorFlow's start-up chatter, and every evaluation.
    log = client.get(f"/api/jobs/{job['id']}/logs").json()
    messages = [line["message"] for line in log]
    assert not [m for m in messages if "absl::InitializeLog" in m or "oneDNN custom operations" in m], messages[:5]
    said = [m for m in messages if m.startswith("evaluation at step ")]
    assert len(said) == len(evals) and said[-1].startswith(f"evaluation at step 300: loss {evals[-1]['loss']:.4g}, ")
    assert said[-1].endswith(f"accuracy {100 * evals[-1]['accuracy']:.2f}%")

    # Prometheus sees it: the wait histograms counted the job, the scheduler its passes.
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
    }
    assert samples[("towerq_queue_wait_seconds_count", ())] == 1
    assert samples[("towerq_submit_to_running_seconds_count", ())] == 1
    assert 0 < samples[("towerq_submit_to_running_seconds_sum", ())] < 120
    assert samples[("towerq_scheduling_pass_seconds_count", ())] >= 1
    assert samples[("towerq_jobs", (("state", "succeeded"), ("user", "alice")))] == 1


def running_interval(job: dict) -> tuple[datetime, datetime]:
    times = {e["state"]: datetime.fromisoformat(e["time"]) for e in job["events"]}
    return times["running"], times["succeeded"]


def test_disjoint_gpus_run_together_and_a_shared_gpu_runs_one_after_the_other(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 4)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register")
    quick = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 150, "batch_size": 16, "log_every": 50}}

    ids = [client.post("/api/jobs", json={**quick, "gpus": gpus}).json()["id"] for gpus in ([0], [1], [2], [2])]
    jobs = [finished(client, i) for i in ids]
    assert [j["state"] for j in jobs] == ["succeeded"] * 4
    a, b, c, d = (running_interval(j) for j in jobs)
    assert a[0] < b[1] and b[0] < a[1], "jobs on GPUs 0 and 1 should overlap"
    assert c[1] <= d[0] or d[1] <= c[0], "two jobs on GPU 2 must not overlap"
