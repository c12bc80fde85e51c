"""The trainer's sandbox, through real processes: user code in bubblewrap cannot read the
database, another job's artifacts or another user's dataset, nor write outside its own
folder; it can read its own dataset and the shared models. The same job without the
sandbox reads them all, so the sandbox is what stops it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.engine import make_url

from service.core.settings import Settings
from tests.stack import Stack, wait_for
from towerq.contract.paths import job_folder

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

SNOOP = """
import keras


def attempt(label, action):
    try:
        action()
        print(f"SNOOP {label} allowed")
    except OSError as err:
        print(f"SNOOP {label} blocked {type(err).__name__}")


def build(params):
    names, paths = params["model_options"]["names"], params["model_options"]["paths"]
    targets = dict(zip(names, paths))
    for label, path in sorted(targets.items()):
        attempt(f"read {label}", lambda path=path: open(path, "rb").read(1))
    attempt("write own-folder", lambda: open("written-by-the-job.txt", "w").write("ok"))
    attempt("write models", lambda: open(targets["models"], "a").write("# changed"))
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url, sandbox="bwrap")


def lines_of(log: str) -> dict[str, str]:
    found = {}
    for line in log.splitlines():
        if "SNOOP " in line:
            words = line.split("SNOOP ", 1)[1].split()
            found[" ".join(words[:2])] = words[2]
    return found


def test_user_code_in_the_sandbox_reaches_only_what_its_job_needs(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    assert shutil.which("bwrap"), "bubblewrap is missing: run scripts/setup-system --test"
    data = settings.data_dir
    rng = np.random.default_rng(1)
    for owner, name in (("alice", "mine"), ("bob", "private")):
        (data / "users" / owner / name).mkdir(parents=True)
        np.savez(
            data / "users" / owner / name / "data.npz", x=rng.random((30, 3), dtype=np.float32), y=np.arange(30) % 3
        )
    other_job = job_folder(settings.artifacts_dir, 4242) / "secret.txt"
    other_job.parent.mkdir(parents=True)
    other_job.write_text("another job's")
    (settings.models_path / "snoop.py").write_text(SNOOP)
    database = make_url(settings.database_url).database
    assert database is not None and Path(database).is_file()
    targets = {
        "database": database,
        "other-job": str(other_job),
        "other-user": str(data / "users/bob/private/data.npz"),
        "own-dataset": str(data / "users/alice/mine/data.npz"),
        "models": str(settings.models_path / "snoop.py"),
    }
    spec = {
        "model": "snoop:build",
        "dataset": "npz:users/alice/mine/data.npz",
        "gpus": [0],
        "hyperparameters": {
            "steps": 4,
            "batch_size": 8,
            "model_options": {"names": list(targets), "paths": list(targets.values())},
        },
    }
    stack.start_api()
    stack.start_scheduler()
    client = stack.client(make_token("alice"))

    def run_job(sandbox: str) -> tuple[dict[str, str], dict]:
        worker = stack.start_worker("lab-a", 1, sandbox=sandbox)
        wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
        created = client.post("/api/jobs", json=spec)
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "job", 1)
        assert job["state"] == "succeeded", job["error"]
        stack.stop("worker-lab-a")
        assert worker.returncode == 0
        return lines_of(client.get(f"/api/jobs/{job_id}/logs.txt").text), job

    seen, job = run_job("bwrap")
    assert seen == {
        "read database": "blocked",
        "read other-job": "blocked",
        "read other-user": "blocked",
        "read own-dataset": "allowed",
        "read models": "allowed",
        "write own-folder": "allowed",
        "write models": "blocked",
    }, seen
    assert (job_folder(settings.artifacts_dir, job["id"]) / "written-by-the-job.txt").read_text() == "ok"
    assert (settings.models_path / "snoop.py").read_text() == SNOOP

    unsandboxed, _ = run_job("none")
    assert unsandboxed == {key: "allowed" for key in seen}, unsandboxed
    client.close()


def test_a_sandboxed_trainer_still_checkpoints_when_stopped(stack: Stack, make_token: Callable[..., str]) -> None:
    """A stop spares bwrap (which would die of SIGTERM and take the trainer with it): the
    trainer inside gets it, checkpoints and stops."""
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    spec = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 10_000_000, "log_every": 10}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    wait_for(lambda: (client.get(f"/api/jobs/{job_id}").json()["step"] or 0) >= 20, 120, "the job to train")
    client.post(f"/api/jobs/{job_id}/cancel")
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 60, "cancel", 0.5)
    assert job["state"] == "cancelled"
    log = client.get(f"/api/jobs/{job_id}/logs.txt").text
    assert "trainer stopped at step" in log, log[-2000:]
    client.close()
