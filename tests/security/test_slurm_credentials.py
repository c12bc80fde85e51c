"""On a Slurm node towerq's runner (`worker.slurm`) held the scheduler's whole environment
(`sbatch --export=ALL`): the database's URL and Redis' URL with their passwords, that make
anyone who reads them admin of the lab. The trainer runs as the runner's user: without the
sandbox (an admin's `TOWERQ_SANDBOX=none`, or a runner that forgot it) it reads the runner's
`/proc/PID/environ`. Now the batch script gets the API's address and its attempt's own
token (`batch_environment`, the attempt protocol over HTTP), and nothing to find.

The model below searches its own environment and every ancestor's (`environ`, `cmdline`),
the files their command lines name, the files in their working folders and Slurm's batch
script, for the URLs and for the settings' names. Before the change it found TOWERQ_DATABASE_URL
and TOWERQ_REDIS_URL in the runner's environment. (The scheduler and the API run on this
same machine in the test, as the nodes and towerq's host do not in a lab: only the
attempt's own process tree is searched.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.core.settings import Settings
from tests.on_slurm import FINAL, cluster, needs_slurm, on_slurm, slurm_settings, wait_state
from tests.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slow, needs_slurm]
FIXTURES = (cluster, on_slurm)

SEARCHER = """
import glob
import json
import os

import keras

NEEDLES = {needles!r}
SCRIPTS = {scripts!r}  # where slurmd keeps the batch scripts of the jobs it runs


def ancestors():
    pid = os.getpid()
    while pid > 1:
        yield pid
        with open("/proc/%d/stat" % pid) as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])


def read(path):
    with open(path, "rb") as f:
        return f.read(1 << 20).decode(errors="replace")


def files_of(pid, cmdline):
    # the files a process names on its command line (Slurm's batch script among them) and
    # those in its working folder
    named = [arg for arg in cmdline.split("\\0") if arg.startswith("/")]
    try:
        cwd = os.readlink("/proc/%d/cwd" % pid)
        named += [os.path.join(cwd, name) for name in os.listdir(cwd)]
    except OSError:
        pass
    return [path for path in named if os.path.isfile(path)]


def search():
    found, files = [], set()
    for pid in ancestors():
        for part in ("environ", "cmdline"):
            try:
                text = read("/proc/%d/%s" % (pid, part))
            except OSError as err:
                found.append("%d/%s unreadable: %s" % (pid, part, type(err).__name__))
                continue
            found += ["%d/%s: %s" % (pid, part, needle) for needle in NEEDLES if needle in text]
            if part == "cmdline":
                files.update(files_of(pid, text))
    files.update(glob.glob(SCRIPTS))
    for path in sorted(files):
        try:
            text = read(path)
        except OSError:
            continue
        # in files the URLs themselves (a file may name the settings: towerq's own docs do)
        found += ["%s: %s" % (path, needle) for needle in NEEDLES if "://" in needle and needle in text]
    return found, sorted(files)


def build(params):
    found, files = search()
    print("FOUND " + json.dumps([len(list(ancestors())), found, files]), flush=True)
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


@pytest.fixture
def settings(
    make_settings: Callable[..., Settings], sqlite_url: str, tmp_path: Path, cluster: SlurmCluster
) -> Settings:
    made = slurm_settings(make_settings, sqlite_url, tmp_path)
    made.sandbox = "none"  # the trainer sees every process of its user, as a runner that forgot the sandbox
    made.models_path.mkdir(parents=True, exist_ok=True)
    needles = [made.database_url, made.redis_url, "TOWERQ_DATABASE_URL", "TOWERQ_REDIS_URL"]
    scripts = str(cluster.root / "spool" / "job*" / "slurm_script")
    (made.models_path / "searcher.py").write_text(SEARCHER.format(needles=needles, scripts=scripts))
    return made


def test_a_model_on_a_slurm_node_finds_no_database_or_redis_credential(on_slurm: Any, cluster: SlurmCluster) -> None:
    client = on_slurm
    spec = {"model": "searcher:build", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 3}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    done = wait_state(client, job_id, FINAL, 180)
    log = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]
    said = [json.loads(m.removeprefix("FOUND ")) for m in log if m.startswith("FOUND ")]
    assert said, log[-20:]
    for searched, found, files in said:
        assert searched >= 3, "itself, the runner and Slurm's step daemon at least"
        assert any("slurm_script" in path for path in files), files  # the batch script was read
        assert found == [], found
    assert done["state"] == "succeeded", done["reason"]
