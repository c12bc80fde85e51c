"""A job's log and metric rows counted toward no limit: one attempt wrote a 100 MB log and
155 MB of database rows while the Usage page showed 1.4 MB, and that repeated per attempt.
Now a job's log is capped over all its attempts (TOWERQ_JOB_LOG_MAX_MB), and what its log
and metric points take is counted per job and shown per member on the Usage page."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

FLOODER = """
import keras


def build(params):
    for i in range(3000):  # ~3 MB of log lines
        print(f"line {i} " + "x" * 1000, flush=True)
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    (make_settings(sqlite_url).models_path / "flooder.py").write_text(FLOODER)
    return make_settings(sqlite_url, job_log_max_mb=1)


def test_a_jobs_log_is_capped_over_its_attempts_and_counted_for_its_member(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    stack.start_api(job_log_max_mb=1)
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_pool=0, job_log_max_mb=1)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    spec = {"model": "flooder:build", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 3}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 0.5)
    assert job["state"] == "succeeded", job["error"]
    text = client.get(f"/api/jobs/{job_id}/logs.txt").text
    assert "reached 1 MB (TOWERQ_JOB_LOG_MAX_MB): the rest dropped" in text
    assert "line 2999 " not in text and len(text) < 1.2 * 2**20, len(text)
    stored = client.get("/api/usage/storage").json()
    row = next(r for r in stored["users"] if r["user"] == "mallory")
    assert 2**20 * 0.9 < row["log_bytes"] <= 2**20 + 20_000, row
    assert row["metric_points"] >= 1 and stored["job_log_max_bytes"] == 2**20
    client.close()
