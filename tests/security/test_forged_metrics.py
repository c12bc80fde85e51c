"""A trainer's metric lines come on the stdout its user code prints to: a model can forge
`eval` lines with its "own metrics". What towerq keeps of them on the job's row (the jobs
list's columns) and says of them in the job's log is bounded like every metric point: at most
16 metrics, names cut to 48 characters, values numbers or nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for
from towerq.contract.events import MAX_CUSTOM_METRICS

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

FORGER = """
import json

import keras


def build(params):
    # Under the 1 MiB a line may take (a longer one is cut and read as no event at all).
    values = [0.25, "not a number", 1e308 * 10]  # a number, a string, an infinity
    metrics = {("m%03d" % i) + "x" * 300: values[i % 3] for i in range(500)}
    for step in (1, 2):
        print(json.dumps({"event": "eval", "step": step, "loss": 0.5, "accuracy": 0.5, "metrics": metrics}), flush=True)
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    (make_settings(sqlite_url).models_path / "forger.py").write_text(FORGER)
    return make_settings(sqlite_url)


def test_forged_metrics_of_a_model_are_kept_and_logged_only_within_bounds(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    spec = {"model": "forger:build", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 3}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 0.5)
    assert job["state"] == "succeeded", job["error"]

    kept = job["latest"]["eval_custom_metrics"]
    assert kept is not None and len(kept) == MAX_CUSTOM_METRICS
    assert all(len(name) <= 48 for name in kept)
    assert all(value is None or math.isfinite(value) for value in kept.values())  # no strings, no infinities
    assert sum(value == 0.25 for value in kept.values()) == 6  # the numbers among the first 16
    log = client.get(f"/api/jobs/{job_id}/logs.txt").text.splitlines()
    forged = [line for line in log if "evaluation at step" in line and "m000" in line]  # build() may run twice
    assert forged and all(len(line) < 600 for line in forged), forged  # 6 short names, not 500 long ones
    assert len(json.dumps(job)) < 20_000  # the row a list page serves stays small
    client.close()
