"""A job that waits for another (`after`) gets that job's folder as an input: read-only, at
`/inputs/job-<id>` in the sandbox, and nothing else of anyone's. A model that fine-tunes
from its dependency's `model.keras` works; one that then writes into that folder (to plant
a file in another job's results) is refused, and sees no other job's folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

FINETUNE = """
import json
import os

import keras


def build(params):
    (job_id, folder), = params["inputs"].items()
    base = keras.models.load_model(os.path.join(folder, "model.keras"))
    said = {"job": job_id, "folder": folder, "layers": len(base.layers)}
    try:
        with open(os.path.join(folder, "planted.txt"), "w") as planted:
            planted.write("not yours")
        said["write"] = "written"
    except OSError as err:
        said["write"] = "refused: " + type(err).__name__
    said["inputs"] = sorted(os.listdir("/inputs")) if os.path.isdir("/inputs") else None
    print("INPUTS " + json.dumps(said), flush=True)
    return base
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    made = make_settings(sqlite_url)
    made.models_path.mkdir(parents=True, exist_ok=True)
    (made.models_path / "finetune.py").write_text(FINETUNE)
    return made


def ended(client: object, job_id: int) -> dict:
    return wait_for(
        lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j,  # type: ignore[attr-defined]
        240,
        f"job {job_id} to end",
        0.5,
    )


def test_a_job_fine_tunes_from_its_dependencys_model_and_cannot_write_into_its_folder(
    stack: Stack, make_token: Callable[..., str], settings: Settings
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, trainer_pool=0)
    alice, bob = stack.client(make_token("alice")), stack.client(make_token("bob"))
    wait_for(lambda: alice.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    base = {"dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 20}}
    first = alice.post("/api/jobs", json={**base, "model": "mlp"}).json()["id"]
    secret = bob.post("/api/jobs", json={**base, "model": "mlp"}).json()["id"]
    tuned = alice.post("/api/jobs", json={**base, "model": "finetune:build", "after": [first]}).json()["id"]
    waiting = wait_for(lambda: (j := alice.get(f"/api/jobs/{tuned}").json())["reason"] and j, 30, "its reason")
    assert waiting["state"] == "queued" and waiting["reason"] == f"waiting for job {first} to succeed"

    assert ended(alice, first)["state"] == "succeeded"
    assert ended(bob, secret)["state"] == "succeeded"
    done = ended(alice, tuned)
    assert done["state"] == "succeeded", done["reason"]
    log = [line["message"] for line in alice.get(f"/api/jobs/{tuned}/logs").json()]
    said = [json.loads(m.removeprefix("INPUTS ")) for m in log if m.startswith("INPUTS ")]
    assert said, log[-20:]
    assert said[0]["job"] == str(first) and said[0]["folder"] == f"/inputs/job-{first}" and said[0]["layers"] > 0
    assert said[0]["write"].startswith("refused"), said[0]
    assert said[0]["inputs"] == [f"job-{first}"]  # bob's job's folder is nowhere in sight
    assert f"job {first}'s folder is an input (read-only): params['inputs']['{first}']" in log
    assert not (Path(settings.artifacts_dir) / f"job-{first}" / "planted.txt").exists()
