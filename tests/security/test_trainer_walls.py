"""A member's model as the attacker, in the real sandbox: one code bundle whose `build`
tries what the containment review found (a link from its log to the admin token, the
host's processes, a `setsid()` child that outlives its job, Redis, root's capabilities and sysctls, a
forged `started` line, log and metric lines no column holds, a line with no end), through
the real API, scheduler, worker and bubblewrap. Nothing outside the job may change, and the service must still serve."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import pytest
from sqlalchemy.engine import make_url

from service.core.settings import Settings
from tests.stack import Stack, wait_for
from worker import sandbox
from worker.processes import all_processes

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")
SECRET = "tq_admin_secret_of_the_lab"

ATTACK = """
import json, os, socket, subprocess, sys

import keras


def report(label, value):
    print("ATTACK " + json.dumps({"label": label, "value": value}), flush=True)


def build(params):
    options = params["model_options"]
    if os.path.lexists("log.txt"):
        os.remove("log.txt")
    os.symlink(options["token"], "log.txt")  # the job's log becomes the admin token
    report("processes", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    try:
        os.kill(options["worker_pid"], 0)
        report("signal worker", "reached")
    except ProcessLookupError:
        report("signal worker", "no such process")
    except PermissionError:
        report("signal worker", "refused")
    subprocess.Popen(["sleep", options["marker"]], start_new_session=True)  # out of the group
    probe = socket.socket()
    probe.settimeout(2)
    report("redis", "reached" if probe.connect_ex(("127.0.0.1", options["redis_port"])) == 0 else "unreachable")
    try:
        open(options["database"], "rb").read(1)
        report("database", "read")
    except OSError:
        report("database", "not visible")
    capabilities = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")]
    report("capabilities", capabilities[0])
    report("host uid", int([l for l in open("/proc/self/status") if l.startswith("Uid:")][0].split()[2]))
    try:
        pattern = open("/proc/sys/kernel/core_pattern").read()
        open("/proc/sys/kernel/core_pattern", "w").write(pattern)  # the same value: nothing changes if it goes
        report("core_pattern", "written")
    except OSError as err:
        report("core_pattern", type(err).__name__)
    print(json.dumps({"event": "started", "devices": [1], "towers": "many"}), flush=True)
    print(json.dumps({"event": "log", "level": "x" * 100, "message": "a level no column holds"}), flush=True)
    print(json.dumps({"event": "metric", "step": 2**80, "loss": 1.0}), flush=True)
    sys.stdout.write("x" * (3 * 2**20) + "\\n")
    sys.stdout.flush()
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def reports(lines: list[dict]) -> dict[str, object]:
    found = {}
    for line in lines:
        if line["message"].startswith("ATTACK "):
            said = json.loads(line["message"][len("ATTACK ") :])
            found[said["label"]] = said["value"]
    return found


def escapees(marker: str) -> list[int]:
    return [p.pid for p in all_processes() if p.state != "Z" and p.cmdline == f"sleep {marker}"]


def test_user_code_in_the_sandbox_reaches_nothing_of_towerq(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    token = settings.var_dir / "admin-token"
    token.write_text(SECRET)
    stack.start_api()
    stack.start_scheduler()
    # Started in the folder that holds its state (as `towerq up` in a lab's folder): that
    # folder is on its import path, and used to be shown to trainers whole.
    lab = settings.var_dir.parent
    worker = stack.start_worker("lab-a", 1, cwd=lab, sandbox="bwrap", trainer_pool=0)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    bundle = client.post("/api/code", files={"file": ("attack.py", ATTACK.encode())})
    assert bundle.status_code == 201, bundle.text
    marker = f"{3000 + time.time() % 1000:.3f}"
    options = {
        "token": str(token.resolve()),
        "worker_pid": worker.pid,
        "marker": marker,
        "redis_port": urlparse(settings.redis_url).port or 6379,
        "database": str(make_url(settings.database_url).database),
    }
    spec = {
        "model": "attack:build",
        "dataset": "digits",
        "code": bundle.json()["id"],
        "gpus": [0],
        "hyperparameters": {"steps": 3, "batch_size": 8, "model_options": options},
    }
    created = client.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job")
    lines = client.get(f"/api/jobs/{job_id}/logs", params={"tail": 5000}).json()
    said = reports(lines)
    messages = "\n".join(line["message"] for line in lines)

    assert job["state"] == "succeeded", (job["error"], messages[-3000:])
    assert token.read_text() == SECRET, "the relay appended the job's log to the admin token"
    assert SECRET not in client.get(f"/api/jobs/{job_id}/logs.txt").text
    assert said["processes"] == [1, 2], said["processes"]  # bwrap's init and the trainer: nothing of the host
    assert said["signal worker"] == "no such process"
    assert Path(str(options["database"])).is_relative_to(lab) and said["database"] == "not visible"
    assert said["redis"] == "unreachable"
    assert int(str(said["capabilities"]), 16) == 0
    assert said["host uid"] != 0 and said["core_pattern"] != "written", said
    wait_for(lambda: not escapees(marker), 10, "the setsid() child to die with its job")
    assert "'started' line that does not fit the protocol was ignored" in messages
    assert "was cut there" in messages
    assert "a level no column holds" in messages
    assert "a 'metric' line that does not fit the protocol was ignored" in messages
    assert client.get("/api/jobs").status_code == 200 and job["towers"] == 1
    bystander = stack.client(make_token("alice"))
    assert bystander.get("/api/jobs").status_code == 200 and bystander.get("/api/gpus").status_code == 200
    bystander.close()
    assert worker.poll() is None, "the worker died"
    client.close()


def test_a_folder_on_the_import_path_that_holds_towerq_state_is_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`towerq up` run from a folder puts that folder (with its `var/`) on the import path:
    every entry used to be bound into the sandbox, and with it the database."""
    lab = tmp_path / "lab"
    (lab / "var").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(lab), "", *sys.path])
    monkeypatch.chdir(lab)
    shown = sandbox.python_paths(Path(__file__).resolve().parents[2], protected=[lab / "var"])
    assert lab not in shown and all(lab not in path.parents for path in shown)
    python = Path(sys.base_prefix).resolve()
    assert any(path == python or python in path.parents for path in shown)  # Python itself still is
    dependencies = tmp_path / "dependencies"  # a `.pth` file's folder of packages: still shown
    dependencies.mkdir()
    monkeypatch.setattr(sys, "path", [str(lab), str(dependencies), *sys.path])
    assert dependencies.resolve() in sandbox.python_paths(Path(__file__).resolve().parents[2], protected=[lab / "var"])
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    guarded = sandbox.python_paths(Path(__file__).resolve().parents[2], protected=[Path(sys.prefix) / "var"])
    assert Path(sys.prefix).resolve() not in guarded  # a prefix that holds towerq's state is not shown whole
