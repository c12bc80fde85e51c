"""A command job's warning before its time limit (`"signal": "USR1@W"`, as `sbatch
--signal`): the program gets the signal W seconds before the limit stops it, once, and its
children do not (they would die of it); each rank does with `"processes": "per_gpu"`. In
the sandbox and out of it, through the real API, scheduler, worker and bubblewrap."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.faults.helpers import FINAL, wait_state
from tests.stack import Stack, load_stretch, upload_code, wait_for
from towerq.contract.times import limit_text

pytestmark = pytest.mark.slow

WARNED = """
import os, signal, subprocess, sys, time

began = time.monotonic()
rank = os.environ.get("RANK", "0")
warned = []


def warn(signum, frame):
    warned.append(time.monotonic())
    name = signal.Signals(signum).name
    print(f"rank {rank} warned after {time.monotonic() - began:.1f} s by {name} ({os.environ['TOWERQ_SIGNAL']})",
          flush=True)


signal.signal(signal.SIGUSR1, warn)
print(f"rank {rank} ready", flush=True)
# a child that catches nothing: the warning is the program's alone, so it lives on
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
said = 0
while True:
    time.sleep(0.1)
    if len(warned) > said and time.monotonic() - warned[-1] > 1:
        said += 1
        print(f"rank {rank}: its child {'lives' if child.poll() is None else 'died'}", flush=True)
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_a_program_is_warned_before_its_time_limit_once_and_again_when_it_changes(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 3, sandbox="bwrap", trainer_pool=0)
    stack.start_worker("lab-b", 1, sandbox="none", trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: len(client.get("/api/gpus").json()) == 4, 60, "both workers to register their GPUs")
    code = upload_code(client, {"warned.py": WARNED})
    lead = round(10 * load_stretch())  # the program is ready well before it: a loaded start took 4 s
    limit = 2 * lead
    spec = {"command": ["python", "warned.py"], "code": code, "time_limit_s": limit, "signal": f"USR1@{lead}"}
    jobs = {
        "sandboxed": client.post("/api/jobs", json={**spec, "host": "lab-a", "gpu_count": 1}).json()["id"],
        "per_gpu": client.post(
            "/api/jobs", json={**spec, "host": "lab-a", "gpu_count": 2, "processes": "per_gpu"}
        ).json()["id"],
        "unsandboxed": client.post("/api/jobs", json={**spec, "host": "lab-b", "gpu_count": 1}).json()["id"],
    }

    def logs(job_id: int) -> list[str]:
        return [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]

    # Lengthened after the warning (by an admin), the unsandboxed job's program is warned again.
    unsandboxed = jobs["unsandboxed"]
    wait_for(lambda: any("warned after" in line for line in logs(unsandboxed)), 3 * limit, "the first warning")
    root = {"Authorization": f"Bearer {make_token('root', True)}"}
    longer = limit + lead // 2
    assert client.patch(f"/api/jobs/{unsandboxed}", json={"time_limit_s": longer}, headers=root).status_code == 200

    for kind, job_id in jobs.items():
        done = wait_state(client, job_id, FINAL, 6 * limit)
        assert done["state"] == "failed", (kind, done)
        lines = logs(job_id)
        ranks = ["0", "1"] if kind == "per_gpu" else ["0"]
        for rank in ranks:
            assert any(line.endswith(f"rank {rank} ready") for line in lines), (kind, lines)
            warned = [float(m[1]) for line in lines if (m := re.search(rf"rank {rank} warned after ([0-9.]+) s", line))]
            times = 2 if kind == "unsandboxed" else 1
            assert len(warned) == times, (kind, rank, lines)
            assert warned[0] <= lead + 2, (kind, warned)  # about `lead` after the start; at the latest
            assert all(f"by SIGUSR1 (USR1@{lead})" in line for line in lines if "warned after" in line), lines
            lives = [line for line in lines if f"rank {rank}: its child" in line]
            assert lives and all(line.endswith("its child lives") for line in lines if f"rank {rank}: its" in line)
        said = r"SIGUSR1 sent: the time limit of \S+ stops it in (\d+) s"
        sent = [int(m[1]) for line in lines if (m := re.fullmatch(said, line))]
        if kind == "unsandboxed":
            assert done["error"].startswith(f"time limit of {limit_text(longer)} reached"), done["error"]
            assert len(sent) == 2 and lead - 2 <= sent[0] <= lead and 0 <= sent[1] <= lead, lines
        else:
            assert done["error"].startswith(f"time limit of {limit_text(limit)} reached"), (kind, done["error"])
            assert len(sent) == 1 and lead - 2 <= sent[0] <= lead, (kind, lines)
