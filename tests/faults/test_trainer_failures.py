"""A trainer that dies of NaN loss, a bad dataset, or memory ends failed with that reason in
words and its GPU free at once; a job whose attempts keep crashing stops after max_attempts."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.faults.helpers import FINAL, wait_state, wait_step
from tests.stack import Stack, wait_for
from tests.worker.trainer.test_process import HUGE_MODEL

pytestmark = pytest.mark.slow


def start(stack: Stack, make_token: Callable[..., str]):
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register")
    return client


def test_each_failure_ends_the_job_with_its_reason_and_frees_its_gpu(
    stack: Stack, make_token: Callable[..., str], settings: Settings
) -> None:
    (Path(settings.models_path) / "nets.py").write_text(HUGE_MODEL)
    (Path(settings.data_dir) / "broken.npz").write_bytes(b"this is not an npz file")
    client = start(stack, make_token)
    base = {"dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 200, "log_every": 1}}
    cases = {
        "nan": (
            {
                # A regression diverges for certain at this step size, whatever the seed (a
                # classifier may instead die into a constant, finite loss).
                **base,
                "model": "poly2",
                "dataset": "quadratic",
                "hyperparameters": {**base["hyperparameters"], "learning_rate": 100.0, "optimizer": "sgd"},
            },
            "loss became",
        ),
        "dataset": ({**base, "model": "mlp", "dataset": "npz:broken.npz"}, "cannot read broken.npz"),
        "oom": ({**base, "model": "nets:huge"}, "out of memory at step 1"),
        "oom on a shared GPU": ({**base, "model": "nets:huge", "gpu_memory_fraction": 0.5}, "out of memory at step 1"),
    }
    ids = {name: client.post("/api/jobs", json=spec).json()["id"] for name, (spec, _) in cases.items()}
    for name, (_, words) in cases.items():
        done = wait_state(client, ids[name], FINAL, 180)
        assert done["state"] == "failed", name
        assert words in done["error"], (name, done["error"])
        assert done["exit_code"] == 1
    assert all(g["holders"] == [] for g in client.get("/api/gpus").json())

    # Out of memory on a shared GPU: tried once more on a whole GPU, with that reason, then failed.
    shared = client.get(f"/api/jobs/{ids['oom on a shared GPU']}").json()
    assert (shared["attempts"], shared["crashes"]) == (2, 0)
    assert [e["message"] for e in shared["events"] if e["state"] == "queued"][-1] == (
        "ran out of GPU memory on a shared GPU (fraction 0.5): queued again for whole GPUs"
    )
    assert (shared["gpu_memory_fraction"], shared["allocation"]["fraction"]) == (1.0, 1.0)
    assert client.get(f"/api/jobs/{ids['oom']}").json()["attempts"] == 1, "on a whole GPU it fails at once"


def test_a_job_that_keeps_crashing_fails_after_max_attempts(stack: Stack, make_token: Callable[..., str]) -> None:
    client = start(stack, make_token)
    spec = {
        "model": "mlp",
        "dataset": "digits",
        "gpu_count": 1,
        "max_attempts": 2,
        "hyperparameters": {"steps": 10_000_000, "log_every": 10, "checkpoint_every": 100},
    }
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    for attempt in (1, 2):
        wait_for(
            lambda a=attempt: (
                (j := client.get(f"/api/jobs/{job_id}").json())["attempts"] == a and j["state"] == "running"
            ),
            120,
            f"attempt {attempt} to run",
        )
        wait_step(client, job_id, 10)
        stack.stop("worker-lab-a", signal.SIGKILL)
        stack.start_worker("lab-a", 2)  # the new worker finds the dead one's job and requeues it
    done = wait_state(client, job_id, FINAL, 120)
    assert done["state"] == "failed"
    assert done["crashes"] == 2
    # Whoever notices the dead worker first names it: the new worker finding its job, or the
    # scheduler missing the host's heartbeats (3 s here) while the new worker starts.
    reason, _, gave_up = done["error"].partition("; ")
    assert reason in ("worker on lab-a restarted", "host lab-a stopped sending heartbeats"), done["error"]
    assert gave_up == "gave up after 2 crashed attempts"
