"""A rank of a job over several hosts whose trainer says it `stopped` (after a checkpoint,
with the others) records nothing: rank 0, which was asked, records the stop. The line
comes on the stdout user code prints to. A hostile rank 1 that prints it and exits
unasked must not leave its job unrecorded, holding both hosts, nor be run for ever: its
peer notices it gone, the job goes back as a crash, and gives up after `max_attempts`."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, log_messages, wait_for
from tests.test_multihost import FINAL, two_hosts

pytestmark = pytest.mark.slow

FORGER = """
import json
import os
import threading

import keras


def _forge():
    print(json.dumps({"event": "stopped", "step": 1}), flush=True)
    os._exit(0)


def build(params):
    if json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index") == 1:
        threading.Timer(8.0, _forge).start()  # once the ranks train
    inputs = keras.Input(params["input_shape"])
    x = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(params["num_classes"])(x))
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    (make_settings(sqlite_url).models_path / "forged_stop.py").write_text(FORGER)
    return make_settings(sqlite_url)


def test_a_rank_that_says_it_stopped_unasked_sends_its_job_back_as_a_crash(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    client = two_hosts(stack, make_token("mallory"))
    spec = {
        "model": "forged_stop:build",
        "dataset": "digits",
        "gpu_count": 4,
        "max_attempts": 2,
        "hyperparameters": {"steps": 100_000, "batch_size": 4, "log_every": 10},
    }
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 300, "the job", 1)
    assert job["state"] == "failed" and (job["attempts"], job["crashes"]) == (2, 2), job
    assert "gave up after 2 crashed attempts" in job["error"], job["error"]

    def forged() -> list[str]:
        lines = log_messages(client, job_id)
        return [m for m in lines if m.startswith("[rank 1 on ") and "trainer stopped at step 1 after a" in m]

    # the line was read, once an attempt; rank 1's worker writes its last words once its own
    # end is over, which may come after rank 0 recorded the job's (CI read the log before it)
    wait_for(lambda: len(forged()) == 2, 30, "rank 1's last words of each attempt")
    assert len(forged()) == 2, log_messages(client, job_id)[-30:]
    wait_for(lambda: all(not g["holders"] for g in client.get("/api/gpus").json()), 30, "every GPU free")
