"""A command job's worker SIGKILLed mid-run (issue 51): the program dies with it, the job
goes back to the queue when the host misses its heartbeats, its program resumes from its
own checkpoint on another host, and its chart has every step once: the steps the program
reports again replace the first attempt's, and those the dead worker had not stored come
back from the metrics log `towerq.report()` keeps."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from tests.faults.helpers import assert_metrics_continuous, job_of, pid_alive, wait_state
from tests.stack import Stack, upload_code, wait_for

pytestmark = pytest.mark.slow
STEPS = 150

RESUMES = """
import os, time
from pathlib import Path

import numpy as np
import towerq

STEPS = int(os.environ["STEPS"])
checkpoint = Path(os.environ["TOWERQ_CHECKPOINT_DIR"]) / "state.npz"
Path("runs").mkdir(exist_ok=True)  # where it runs: the job's working folder, kept for its next attempt
print("runs:", sorted(path.name for path in Path("runs").iterdir()), flush=True)
Path("runs", "attempt-" + os.environ["TOWERQ_ATTEMPT"]).write_text("here")
step, w = 0, np.zeros(3)
if checkpoint.exists():
    saved = np.load(checkpoint)
    step, w = int(saved["step"]), saved["w"]
    print("resumed at step", step, flush=True)
while step < STEPS:
    step += 1
    w = w + 0.01
    towerq.report(step=step, loss=float(1.0 / step), w0=float(w[0]))
    if step % 10 == 0:
        np.savez(str(checkpoint) + ".tmp.npz", step=step, w=w)
        os.replace(str(checkpoint) + ".tmp.npz", checkpoint)
    time.sleep(0.05)
(Path(os.environ["TOWERQ_OUTPUT_DIR"]) / "w.txt").write_text(str(list(w)))
"""


def test_a_command_job_resumes_from_its_checkpoint_without_a_step_twice_or_missing(
    stack: Stack, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    doomed = stack.start_worker("lab-b", 1, trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 30, "lab-b to register")
    code = upload_code(client, {"resume.py": RESUMES})
    job_id = client.post(
        "/api/jobs",
        json={"command": ["python", "resume.py"], "code": code, "resumable": True, "env": {"STEPS": str(STEPS)}},
    ).json()["id"]
    wait_for(lambda: len(client.get(f"/api/jobs/{job_id}/metrics").json()) >= 45, 120, "step 45")

    stack.stop("worker-lab-b", signal.SIGKILL)
    assert doomed.poll() is not None
    stack.start_worker("lab-a", 1, trainer_pool=0)
    wait_for(lambda: job_of(client, job_id)["attempts"] == 2, 60, "the job to be requeued")
    done = wait_state(client, job_id, ("succeeded", "failed", "cancelled"))

    assert done["state"] == "succeeded", done["error"]
    assert (done["attempts"], done["crashes"]) == (2, 1)
    points = assert_metrics_continuous(client, job_id, 1, STEPS)
    logs = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 5000}).json()]
    resumed = [int(m.rsplit(" ", 1)[1]) for m in logs if m.startswith("resumed at step")]
    assert len(resumed) == 1 and resumed[0] >= 40 and resumed[0] % 10 == 0, resumed
    assert {p["attempt"] for p in points if p["step"] <= resumed[0]} == {1}, "points before the checkpoint stay"
    assert {p["attempt"] for p in points if p["step"] > resumed[0]} == {2}, "the steps reported again replace"
    assert [p["custom"]["w0"] for p in points][-1] == pytest.approx(0.01 * STEPS)
    first_pid = int(next(e["message"] for e in done["events"] if e["state"] == "running").split()[1])
    assert not pid_alive(first_pid), "the killed worker's program must not survive it"
    listed = {a["path"] for a in client.get(f"/api/jobs/{job_id}/artifacts").json()["items"]}
    assert {"output/w.txt", "checkpoints/state.npz", "work/runs/attempt-2"} <= listed
    assert "runs: []" in logs and "runs: ['attempt-1']" in logs, "what it wrote where it runs is there again"
