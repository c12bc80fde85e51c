"""A forged `started` line used to make the worker read the job's own `metrics.jsonl` back
(the resume path) whole, a dict per line, in the worker's process and outside the job's
cgroup: 48 MB of lines took a worker from 113 MB to 1.7 GB, and the line could be repeated.
An OOM of the worker kills every trainer on its host. Now the worker takes one valid
`started` line an attempt and reads the file a block at a time, keeping a batch of points."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for
from towerq.contract.paths import lines_beneath

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")
FILE_MB = 40

FORGER = """
import json, time

import keras


def build(params):
    point = json.dumps({"event": "metric", "step": 7, "loss": 0.5, "accuracy": 0.5, "pad": "x" * 150}) + "\\n"
    with open("metrics.jsonl", "w") as log:
        for _ in range(FILE_MB * 2**20 // len(point)):
            log.write(point)
    for _ in range(3):  # a resume from step 0, three times: the file's points are all after it
        print(json.dumps({"event": "started", "resumed_from_step": 0}), flush=True)
    time.sleep(8)  # the worker reads the file meanwhile (the trainer rewrites it once training starts)
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
""".replace("FILE_MB", str(FILE_MB))


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    (make_settings(sqlite_url).models_path / "forger.py").write_text(FORGER)
    return make_settings(sqlite_url)


def peak_mb(pid: int) -> float:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]) / 1024


def test_a_forged_started_line_costs_the_worker_no_more_than_a_batch(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    worker = stack.start_worker("lab-a", 1, trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    before = peak_mb(worker.pid)
    spec = {"model": "forger:build", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 3}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 0.5)
    messages = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 500}).json()]

    assert job["state"] == "succeeded", job["error"]
    assert messages.count("a second 'started' line was ignored: an attempt starts once") >= 2, messages[-20:]
    grown = peak_mb(worker.pid) - before
    assert grown < 150, f"the worker's peak grew by {grown:.0f} MB reading a {FILE_MB} MB metrics log"
    assert worker.poll() is None
    client.close()


def test_a_resume_reads_only_bounded_lines_of_the_metrics_log(tmp_path: Path) -> None:
    """A line past the per-line bound is passed over whole; lines after it still count."""
    point = json.dumps({"event": "metric", "step": 1}).encode()
    (tmp_path / "metrics.jsonl").write_bytes(point + b"\n" + b"x" * 300_000 + b"\n" + point + b"\n" + b"torn")
    assert list(lines_beneath(tmp_path, "metrics.jsonl", 2**20, 1024)) == [point, point]
    assert list(lines_beneath(tmp_path, "metrics.jsonl", 10, 1024)) == []  # nothing past the read bound
    assert list(lines_beneath(tmp_path, "absent.jsonl", 2**20, 1024)) == []
