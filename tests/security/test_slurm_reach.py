"""On a Slurm cluster the trainer (or a command job's program, or a notebook session's
kernel) runs in the Slurm job towerq
submitted, as the user that submitted it, beside towerq's own runner (`worker.slurm`, whose
environment once held the database URL, tests/security/test_slurm_credentials.py, and holds
its attempt's token from its start). A member's model or program there must not
reach Slurm (with `scancel --me` it would cancel every towerq job of the lab, with `sbatch`
take GPUs outside towerq), the runner's environment, or the folder Slurm writes the
attempts' own output to. The sandbox is what
stops it: run on Slurm without it (a runner that forgot it), this model cancels its
neighbour's job."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.core.settings import Settings
from tests.notebook_kernel import run_code, start_kernel, wait_ready
from tests.on_slurm import FINAL, LONG, cluster, job_of, needs_slurm, on_slurm, slurm_settings, trained, wait_state
from tests.slurm_cluster import SlurmCluster
from tests.stack import upload_code

pytestmark = [pytest.mark.slow, needs_slurm]
FIXTURES = (cluster, on_slurm)

REACH = """
import json
import os
import socket
import subprocess

SLURM_CONF, MUNGE_SOCKET, SLURM_LOGS = {paths!r}


def attempt(what):
    try:
        return what()
    except Exception as err:
        return "refused: " + type(err).__name__


def scancel():
    env = dict(os.environ, SLURM_CONF=SLURM_CONF)
    done = subprocess.run(["scancel", "--me"], env=env, capture_output=True, text=True, timeout=30)
    return "exit %d %s" % (done.returncode, done.stderr.strip()[:200])


def munge():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(MUNGE_SOCKET)
    return "connected"


def environments():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    seen = f.read()
            except OSError:
                continue
            if b"TOWERQ_DATABASE_URL" in seen or b"TOWERQ_ATTEMPT_TOKEN" in seen:
                found.append(pid)
    return found


def reach():
    said = {{
        "scancel": attempt(scancel),
        "munge": attempt(munge),
        "environ": environments(),
        "logs": attempt(lambda: os.listdir(SLURM_LOGS)),
    }}
    print("REACH " + json.dumps(said), flush=True)
"""
REACHER = (
    REACH
    + """
import keras


def build(params):
    reach()
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""
)
PROGRAM = REACH + "\nreach()\n"
"""A command job's program: the member's own code from its first line, behind the same walls."""


@pytest.fixture
def settings(
    make_settings: Callable[..., Settings], sqlite_url: str, tmp_path: Path, cluster: SlurmCluster
) -> Settings:
    made = slurm_settings(make_settings, sqlite_url, tmp_path)
    made.models_path.mkdir(parents=True, exist_ok=True)
    (made.models_path / "reacher.py").write_text(REACHER.format(paths=reach_paths(made, cluster)))
    return made


def reach_paths(settings: Settings, cluster: SlurmCluster) -> tuple[str, str, str]:
    return str(cluster.conf), str(cluster.root / "munge" / "munge.socket"), str(settings.slurm_log_dir.resolve())


def test_a_model_run_by_slurm_reaches_neither_slurm_nor_the_runner_nor_slurms_logs(
    on_slurm: Any, cluster: SlurmCluster, settings: Settings
) -> None:
    spec = {"model": "reacher:build", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 3}}
    reaches_nothing(on_slurm, cluster, settings, spec)


def test_a_command_jobs_program_run_by_slurm_reaches_neither_slurm_nor_the_runner_nor_slurms_logs(
    on_slurm: Any, cluster: SlurmCluster, settings: Settings
) -> None:
    code = upload_code(on_slurm, {"reach.py": PROGRAM.format(paths=reach_paths(settings, cluster))})
    reaches_nothing(on_slurm, cluster, settings, {"command": ["python", "reach.py"], "code": code, "gpu_count": 1})


def test_a_notebook_sessions_kernel_on_slurm_reaches_neither_slurm_nor_the_runner_nor_slurms_logs(
    on_slurm: Any, cluster: SlurmCluster, settings: Settings, stack: Any
) -> None:
    client = on_slurm
    neighbour = client.post("/api/jobs", json={**LONG, "gpu_count": 1}).json()["id"]
    trained(client, neighbour)
    session = client.post("/api/jobs", json={"kind": "notebook", "gpu_count": 1}).json()["id"]
    wait_ready(client, session)
    kernel = start_kernel(client, session)
    code = PROGRAM.format(paths=reach_paths(settings, cluster))
    printed = run_code(client, str(stack.api_url), client.token, session, kernel, code)
    reached = [json.loads(m.removeprefix("REACH ")) for m in printed.splitlines() if m.startswith("REACH ")]
    assert reached, printed[-2000:]
    walls_held(reached)
    assert client.post(f"/api/jobs/{session}/cancel").status_code == 202
    assert wait_state(client, session, FINAL, 60)["state"] == "cancelled"
    neighbour_untouched(client, cluster, settings, neighbour)


def reaches_nothing(client: Any, cluster: SlurmCluster, settings: Settings, spec: dict[str, Any]) -> None:
    neighbour = client.post("/api/jobs", json={**LONG, "gpu_count": 1}).json()["id"]
    trained(client, neighbour)
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    done = wait_state(client, job_id, FINAL, 180)

    log = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]
    reached = [json.loads(m.removeprefix("REACH ")) for m in log if m.startswith("REACH ")]
    assert reached, log[-20:]
    walls_held(reached)
    assert done["state"] == "succeeded", done["reason"]
    neighbour_untouched(client, cluster, settings, neighbour)


def walls_held(reached: list[dict[str, Any]]) -> None:
    for said in reached:
        assert not said["scancel"].startswith("exit 0"), said
        assert said["munge"].startswith("refused"), said
        assert said["environ"] == [], said
        assert said["logs"].startswith("refused"), said


def neighbour_untouched(client: Any, cluster: SlurmCluster, settings: Settings, neighbour: int) -> None:
    assert job_of(client, neighbour)["state"] == "running"
    ours = [j for j in cluster.jobs() if j["name"].startswith(f"{settings.slurm_job_prefix}-")]
    states = [j["state"] for j in ours if j["name"].endswith("-1")]
    assert len(states) == 2, ours  # the neighbour and this job
    assert all(state in ("RUNNING", "COMPLETING", "COMPLETED") for state in states), states  # none cancelled
