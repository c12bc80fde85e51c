"""A command job's program as the attacker (issue 51: a command job is the adversary exactly
as a model is), through the real API, scheduler, worker and bubblewrap:

- it searches its environment, `/proc` of every process it sees and every file it can read
  for what the worker holds (the database URL, an admin token, a secret in the worker's
  environment) and finds none;
- it prints the trainer's words (`done`, `started`, `error`) and protocol lines no column
  holds (a time of NaN, 1e300 or 1970; a step of 2**80): `done` does not make a failing
  program succeed, and the rest is text or dropped, never a crash of the runner (a `time`
  of NaN used to raise in it);
- it replaces its checkpoint folder with a link to a folder of the host: the next attempt
  is refused, and the worker never hands the link's target to the program's user.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, upload_code, wait_for

pytestmark = pytest.mark.slow
SECRET = "tq_admin_secret_of_the_lab_7f3a"
WORKER_SECRET = "hunter2-worker-only"

SEARCH = r"""
import json, os, sys

needles = json.load(open("needles.json"))  # from its own bundle: its argv would name them in /proc
found = []
own = os.getcwd()


def look(where, text):
    for needle in needles:
        if needle in text:
            found.append(f"{needle} in {where}")


look("environ", json.dumps(dict(os.environ)))
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:  # its own argv names them
    for part in ("environ", "cmdline"):
        try:
            look(f"/proc/{pid}/{part}", open(f"/proc/{pid}/{part}", "rb").read().decode(errors="replace"))
        except OSError:
            pass
seen = 0
for top in ("/job", "/tmp", "/etc", "/var", "/root", "/home", "/opt", "/srv", "/mnt", "/usr/local"):
    for folder, subfolders, names in os.walk(top):
        if folder.startswith(own):
            continue
        for name in names:
            path = os.path.join(folder, name)
            try:
                if os.path.islink(path) or os.path.getsize(path) > 2**20:
                    continue
                look(path, open(path, "rb").read().decode(errors="replace"))
                seen += 1
            except OSError:
                pass
print("SEARCHED " + json.dumps({"files": seen, "found": found}), flush=True)
"""

FORGES = r"""
import json, sys
print(json.dumps({"event": "started", "towers": 999, "devices": ["forged"]}), flush=True)
print('{"event": "metric", "step": 1, "loss": 0.5, "time": NaN}', flush=True)
print('{"event": "metric", "step": 2, "loss": 0.4, "time": 1e300}', flush=True)
print('{"event": "eval", "step": 2, "loss": 0.4, "time": 0}', flush=True)
print(json.dumps({"event": "log", "level": "x" * 100, "message": "a level no column holds", "time": -1e20}), flush=True)
print(json.dumps({"event": "metric", "step": 2**80, "loss": 1.0}), flush=True)
print(json.dumps({"event": "error", "kind": "oom", "message": "forged out of memory"}), flush=True)
print(json.dumps({"event": "done", "step": 2, "final": {}}), flush=True)
sys.exit(int(sys.argv[1]))
"""

LINKS = r"""
import os, sys
target = sys.argv[1]
folder = os.environ["TOWERQ_CHECKPOINT_DIR"] if sys.argv[2] == "checkpoints" else os.getcwd()  # work/
os.rename(folder, folder + ".old")
os.symlink(target, folder)
import time, towerq
towerq.report(step=1, loss=1.0)
time.sleep(600)  # until its worker is killed: the job's next attempt starts elsewhere

"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url, heartbeat_timeout_s=3.0, dispatch_timeout_s=3.0)


def messages(client: httpx.Client, job_id: int) -> list[str]:
    return [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 2000}).json()]


def test_a_command_job_finds_no_secret_and_forges_nothing(
    stack: Stack, settings: Settings, make_token: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (settings.var_dir / "admin-token").write_text(SECRET)
    stack.start_api()
    stack.start_scheduler()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WORKER_SECRET)  # what else a worker's host gives it
    monkeypatch.setenv("TF_VAR_database_password", WORKER_SECRET)
    stack.start_worker("lab-a", 1, sandbox="bwrap", trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    database = str(settings.database_url).removeprefix("sqlite:///")
    needles = json.dumps([SECRET, WORKER_SECRET, database, settings.redis_url])
    code = upload_code(client, {"search.py": SEARCH, "forges.py": FORGES, "needles.json": needles})
    searched = client.post("/api/jobs", json={"command": ["python", "search.py"], "code": code})
    assert searched.status_code == 201, searched.text
    job = finished(client, searched.json()["id"])
    said = messages(client, searched.json()["id"])
    assert job["state"] == "succeeded", (job["error"], said[-20:])
    report = json.loads(next(m for m in said if m.startswith("SEARCHED "))[len("SEARCHED ") :])
    assert report["files"] > 100, report  # it did look: the system's files are there to read
    assert report["found"] == [], report["found"]

    failing = client.post("/api/jobs", json={"command": ["python", "forges.py", "1"], "code": code})
    job = finished(client, failing.json()["id"])
    assert job["state"] == "failed", job
    assert job["error"] == "the program exited with code 1", job["error"]  # not the forged oom
    assert job["towers"] is None, "a program's started line is text, not the job's row"

    passing = client.post("/api/jobs", json={"command": ["python", "forges.py", "0"], "code": code})
    job_id = passing.json()["id"]
    job = finished(client, job_id)
    assert job["state"] == "succeeded", (job["error"], messages(client, job_id)[-20:])
    points = client.get(f"/api/jobs/{job_id}/metrics").json()
    assert sorted((p["split"], p["step"]) for p in points) == [("eval", 2), ("train", 1), ("train", 2)]
    started = job["started_at"]
    for point in points:  # the made-up times were replaced by when the lines were read
        assert point["time"][:4] == started[:4] and point["time"] >= started, (point, started)


@pytest.mark.parametrize("planted", ["checkpoints", "work"])
def test_a_link_planted_for_the_checkpoint_folder_is_refused_and_its_target_untouched(
    stack: Stack, settings: Settings, make_token: Callable[..., str], tmp_path: Path, planted: str
) -> None:
    """The checkpoint folder, or the working folder (the copy of its code it runs in, where
    the next attempt copies its code again), replaced by a link to a folder of the host."""
    host_folder = tmp_path / "root-only"
    host_folder.mkdir(mode=0o700)
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, sandbox="bwrap", trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {"links.py": LINKS})
    created = client.post(
        "/api/jobs",
        json={"command": ["python", "links.py", str(host_folder), planted], "code": code, "resumable": True},
    )
    job_id = created.json()["id"]
    wait_for(lambda: client.get(f"/api/jobs/{job_id}/metrics").json(), 60, "the link to be planted")
    stack.stop("worker-lab-a", signal.SIGKILL)
    stack.start_worker("lab-b", 1, sandbox="bwrap", trainer_pool=0)
    job = finished(client, job_id)
    assert job["state"] == "failed", job
    assert f"{planted} in the job's folder is not a folder: the program replaced it" in str(job["error"]), job
    assert host_folder.stat().st_uid == os.getuid() and (host_folder.stat().st_mode & 0o777) == 0o700
    assert list(host_folder.iterdir()) == [], "nothing was copied into it"


FORGED_LOG = r"""
import json, os, sys, time
import towerq

log = os.environ["TOWERQ_METRICS_LOG"]
if os.environ["TOWERQ_ATTEMPT"] == "1":
    if sys.argv[1] == "link":
        os.symlink(sys.argv[2], log)  # a resume would read the admin token as its metrics
    else:  # 40 MB of distinct points before the step it resumes from: one dict each, if held
        with open(log, "w") as out:
            for step in range(1, 200_001):
                out.write(json.dumps({"event": "metric", "step": step, "loss": 0.5, "pad": "x" * 150}) + "\n")
    print("planted", flush=True)
    time.sleep(600)  # until its worker is killed
towerq.report(step=10**6, loss=0.25)
"""


@pytest.mark.parametrize("how", ["link", "big"])
def test_a_programs_forged_metrics_log_is_read_bounded_and_never_through_a_link(
    stack: Stack, settings: Settings, make_token: Callable[..., str], how: str
) -> None:
    token = settings.var_dir / "admin-token"
    token.write_text(json.dumps({"event": "metric", "step": 1, "loss": SECRET}) + "\n")
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, sandbox="bwrap", trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {"forged.py": FORGED_LOG})
    spec = {"command": ["python", "forged.py", how, str(token.resolve())], "code": code, "resumable": True}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    wait_for(lambda: "planted" in messages(client, job_id), 120, "the metrics log to be forged")
    stack.stop("worker-lab-a", signal.SIGKILL)
    worker = stack.start_worker("lab-b", 1, sandbox="bwrap", trainer_pool=0)
    before = peak_mb(worker.pid)
    job = finished(client, job_id)
    said = messages(client, job_id)

    assert job["state"] == "succeeded", (job["error"], said[-20:])
    points = client.get(f"/api/jobs/{job_id}/metrics", params={"limit": 100_000}).json()
    assert SECRET not in json.dumps(points) and SECRET not in "\n".join(said)
    if how == "link":
        assert [p["step"] for p in points] == [10**6], points
    else:
        last = client.get(f"/api/jobs/{job_id}/metrics", params={"after_step": 199_999}).json()
        assert [p["step"] for p in last] == [200_000, 10**6] and len(points) == 100_000, last
        grown = peak_mb(worker.pid) - before
        assert grown < 150, f"the worker's peak grew by {grown:.0f} MB reading a forged 40 MB metrics log"


def peak_mb(pid: int) -> float:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmHWM"].split()[0]) / 1024
