"""Taking a trained model home, through real processes: a user model on 2 simulated GPUs
with EMA; the trainer exports `model.keras`; `towerq download` fetches it, a folder and
everything; the model, loaded in a fresh process, scores what the job reported. The
trainer, running user code, sees none of the worker's secrets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import REPO, Stack, wait_for
from towerq.contract.paths import JOB_LOG_FILE, job_folder, job_log
from worker.sandbox import JOB_PATH, resolve

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")

PROBE = """
import os

import keras


def build(params):
    print("ENVIRONMENT " + " ".join(sorted(os.environ)))
    print("WORKING IN " + os.getcwd())
    return keras.Sequential([
        keras.Input(params["input_shape"]),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(params["num_classes"]),
    ])
"""

SECRETS = {
    "LAB_S3_SECRET_ACCESS_KEY": "s3-secret-value",
    "GITHUB_TOKEN": "ghp-secret-value",
    "LAB_DB_PASSWORD": "db-secret-value",
    "SOME_UNLISTED_VARIABLE": "not-on-the-allow-list",
}

SCORE = """
import json, sys
import numpy as np
import keras
from pathlib import Path
from worker.trainer import datasets, feeding
from towerq.contract.spec import JobSpec

model = keras.saving.load_model(sys.argv[1])
train = JobSpec.model_validate(json.loads(sys.argv[2])).train_spec()
data = datasets.load(train, Path(sys.argv[3]))
correct = total = 0
loss = 0.0
for x, y in feeding.eval_batches(data, 256):
    logits = model(x, training=False)
    loss += float(np.sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)))
    correct += int(np.sum(np.argmax(logits, axis=1) == y.numpy()))
    total += int(x.shape[0])
print(json.dumps({"accuracy": correct / total, "loss": loss / total, "examples": total}))
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_the_trained_model_goes_home_and_scores_what_the_job_reported(
    stack: Stack, settings: Settings, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (settings.models_path / "probe.py").write_text(PROBE)
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    token = make_token("alice")
    api_url = stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 2, token="tq_the_workers_own_token")
    client = stack.client(token)
    wait_for(lambda: client.get("/api/gpus").json(), 30, "the worker to register its GPUs")
    spec = {
        "model": "probe:build",
        "dataset": "digits",
        "gpus": [0, 1],
        "hyperparameters": {"steps": 80, "batch_size": 32, "ema_decay": 0.9, "learning_rate": 0.05},
    }
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 240, "the job", 1)
    assert job["state"] == "succeeded", job["error"]

    # What user code saw: the allow-listed environment, its own working folder.
    log = client.get(f"/api/jobs/{job_id}/logs.txt").text
    seen = next(line for line in log.splitlines() if "ENVIRONMENT " in line).split("ENVIRONMENT ")[1].split()
    assert not [name for name in seen if name.startswith("TOWERQ_")], seen
    assert not set(SECRETS) & set(seen), seen
    assert {"PATH", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"} <= set(seen)
    for value in [*SECRETS.values(), "tq_the_workers_own_token", token, settings.database_url]:
        assert value not in log
    folder = job_folder(settings.artifacts_dir, job_id)
    assert f"WORKING IN {JOB_PATH if resolve(settings.sandbox) else folder}" in log  # its own folder, as it sees it
    assert job_log(settings.artifacts_dir, job_id).read_text() == log  # out of the trainer's view
    assert not (folder / JOB_LOG_FILE).exists()

    listing = [item["path"] for item in client.get(f"/api/jobs/{job_id}/artifacts").json()["items"]]
    assert "exported the trained model as model.keras" in log, log[-3000:]
    assert {"model.keras", JOB_LOG_FILE, "metrics.jsonl", "checkpoints/checkpoint"} <= set(listing)
    assert any(path.startswith("tensorboard/") for path in listing)

    home = tmp_path / "home"

    def download(*path: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "service.cli", "download", str(job_id), *path, "-o", str(home)]
        command += ["--api", api_url, "--token", token]
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)

    for path in (["model.keras"], ["checkpoints"], []):
        done = download(*path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("saved "), done.stdout
    assert (home / "model.keras").read_bytes() == (folder / "model.keras").read_bytes()
    assert (home / f"job-{job_id}-checkpoints" / "checkpoint").is_file()
    assert (home / f"job-{job_id}" / "model.keras").is_file() and (home / f"job-{job_id}" / JOB_LOG_FILE).is_file()
    missing = download("nope.bin")
    assert missing.returncode == 1 and "404: no artifact 'nope.bin'" in missing.stderr

    # The exported model, in a fresh process, scores the job's final evaluation (EMA weights).
    scored = subprocess.run(
        [sys.executable, "-c", SCORE, str(home / "model.keras"), json.dumps(job["spec"]), str(settings.data_dir)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert scored.returncode == 0, scored.stderr
    result = json.loads(scored.stdout.strip().splitlines()[-1])
    final = [m for m in client.get(f"/api/jobs/{job_id}/metrics").json() if m["split"] == "eval"][-1]
    assert result["accuracy"] == pytest.approx(final["accuracy"], abs=1e-6)
    assert result["loss"] == pytest.approx(final["loss"], rel=1e-4)
    client.close()


def test_datasets_go_up_and_away_with_the_cli(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path
) -> None:
    import numpy as np

    api_url = stack.start_api()
    token = make_token("alice")

    def data(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "service.cli", "data", *args, "--api", api_url, "--token", token]
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)

    np.savez(tmp_path / "cells.npz", x=np.zeros((10, 3), np.float32), y=np.arange(10) % 2)
    images = tmp_path / "flowers"
    for kind in ("roses", "tulips"):
        (images / kind).mkdir(parents=True)
        (images / kind / "1.png").write_bytes(b"\x89PNG")
    uploaded = data("upload", "cells", str(tmp_path / "cells.npz"))
    assert uploaded.returncode == 0, uploaded.stderr
    assert '"dataset": "npz:users/alice/cells/data.npz"' in uploaded.stdout
    folder = data("upload", "flowers", str(images))
    assert folder.returncode == 0 and '"dataset": "images:users/alice/flowers/images"' in folder.stdout, folder
    listed = data("list")
    assert "cells" in listed.stdout and "flowers" in listed.stdout and "of 20.0 GB" in listed.stdout
    again = data("upload", "cells", str(tmp_path / "cells.npz"))
    assert again.returncode == 1 and "409: you have a dataset 'cells' already" in again.stderr
    assert data("rm", "cells").returncode == 0
    assert "cells" not in data("list").stdout
    assert not (settings.data_dir / "users/alice/cells").exists()
