"""A member's code tried to become root on the host: as euid 0 in the sandbox it wrote
`|/job/h.sh` into `/proc/sys/kernel/core_pattern`, crashed, and the kernel ran the script
as host root. Here the same reach, through the sandbox's own command line (`bwrap_command`),
once as a root worker runs trainers (CI is root) and once as a worker that is not root
runs them: the trainer is no host root, writes no sysctl (it writes back the value it read,
so a wall that fails changes nothing), reads no root-only file, sees no cgroup of the host
and writes nothing unbounded into `/dev`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.core.settings import Settings
from tests.sandbox_probe import NOBODY, run_probe, sandbox_lab
from worker import sandbox
from worker.launch import check_shared_folders

PROBE = r"""
import json, os

status = {line.split(":")[0]: line.split()[1:] for line in open("/proc/self/status")}
found = {"euid": os.geteuid(), "host_uid": int(status["Uid"][1]), "capabilities": status["CapEff"][0]}


def tried(label, action):
    try:
        action()
        found[label] = "done"
    except OSError as err:
        found[label] = type(err).__name__


def same_sysctl(name):
    with open(f"/proc/sys/{name}") as current:
        value = current.read()
    with open(f"/proc/sys/{name}", "w") as sysctl:
        sysctl.write(value)


tried("write core_pattern", lambda: same_sysctl("kernel/core_pattern"))
tried("write printk_ratelimit", lambda: same_sysctl("kernel/printk_ratelimit"))
tried("read shadow", lambda: open("/etc/shadow").read(1))
tried("write dev", lambda: open("/dev/planted", "w").write("x"))
found["dev entries"] = sorted(os.listdir("/dev"))
found["cgroups seen"] = sorted(os.listdir("/sys/fs/cgroup")) if os.path.isdir("/sys/fs/cgroup") else []
found["own cgroup"] = sorted({line.strip().rpartition(":")[2] for line in open("/proc/self/cgroup")})
try:
    with open("/dev/shm/filler", "wb") as filler:
        for _ in range(64):
            filler.write(b"\0" * 2**20)
    found["dev/shm"] = "unbounded"
except OSError as err:
    found["dev/shm"] = type(err).__name__
open("/job/written", "w").write("the job's folder is its own")
print(json.dumps(found))
"""


@pytest.fixture
def lab() -> Iterator[Path]:
    with sandbox_lab(PROBE) as root:
        yield root


def probe(
    lab: Path, identity: sandbox.Identity | None, monkeypatch: pytest.MonkeyPatch, devices: list[Path] | None = None
) -> dict[str, object]:
    return run_probe(lab, identity, monkeypatch, devices=devices)


def assert_walls_hold(found: dict[str, object], lab: Path) -> None:
    assert found["host_uid"] != 0 and found["euid"] != 0, found
    assert int(str(found["capabilities"]), 16) == 0
    assert found["write core_pattern"] != "done" and found["write printk_ratelimit"] != "done", found
    assert found["read shadow"] == "PermissionError"
    assert found["cgroups seen"] == [], found["cgroups seen"]  # no other job's cgroup, no host pid
    assert found["own cgroup"] == ["/"], found["own cgroup"]
    assert found["write dev"] != "done" and not Path("/dev/planted").exists()
    assert found["dev/shm"] == "OSError", found["dev/shm"]  # ENOSPC at TOWERQ_TRAINER_TMP_MB
    assert (lab / "job" / "written").read_text() == "the job's folder is its own"


@pytest.mark.skipif(os.geteuid() != 0, reason="a root worker: CI and `make run` as root")
def test_a_root_workers_trainer_is_no_host_root(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = probe(lab, sandbox.trainer_identity(*NOBODY), monkeypatch)
    assert found["host_uid"] == NOBODY[0]
    assert_walls_hold(found, lab)


@pytest.mark.skipif(os.geteuid() != 0, reason="plays a worker that is not root through setpriv, which needs root")
def test_a_workers_trainer_that_is_not_root_has_a_user_namespace_and_the_same_walls(
    lab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = probe(lab, None, monkeypatch)
    assert found["host_uid"] == NOBODY[0]
    assert_walls_hold(found, lab)


def test_a_root_worker_never_runs_a_trainer_as_root() -> None:
    with pytest.raises(ValidationError, match="trainer_uid"):
        Settings(trainer_uid=0)
    assert sandbox.trainer_identity(*NOBODY) == (NOBODY if os.geteuid() == 0 else None)


@pytest.mark.parametrize(
    ("setting", "where"),
    [("models_path", "."), ("models_path", "var"), ("data_dir", "var"), ("data_dir", "var/artifacts/..")],
)
def test_a_shared_folder_that_holds_towerqs_state_stops_the_worker(tmp_path: Path, setting: str, where: str) -> None:
    """`TOWERQ_MODELS_PATH` and `TOWERQ_DATA_DIR` are shown whole to every trainer: pointed at
    a folder that holds `var/` (the admin token, the database) they showed it to everyone."""
    var = tmp_path / "var"
    for folder in ("var/artifacts", "var/code", "var/data/users", "models"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    fine = Settings(var_dir=var, artifacts_dir=var / "artifacts", code_dir=var / "code", data_dir=var / "data",
                    models_path=tmp_path / "models", database_url=f"sqlite:///{var}/towerq.db")  # fmt: skip
    check_shared_folders(fine)  # the layout `towerq up` makes
    risky = fine.model_copy(update={setting: tmp_path / where})
    with pytest.raises(sandbox.SandboxError, match=r"TOWERQ_(MODELS_PATH|DATA_DIR) is .* \(towerq's own files\)"):
        check_shared_folders(risky)


STAND_INS = ("/dev/fuse", "/dev/kmsg", "/dev/loop-control", "/dev/cpu_dma_latency", "/dev/tty0")
"""Character devices of a host that bwrap's own /dev lacks, standing in for /dev/nvidia0 and
/dev/nvidiactl: bwrap makes a file in /dev to bind each over."""


def test_a_jobs_gpu_nodes_are_bound_before_dev_turns_read_only(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real H100 (scripts/gpu-check, docs/gpu-check.md) every GPU job failed with
    `bwrap: Can't create file at /dev/nvidiactl: Read-only file system`: /dev was made read
    only before the GPU's nodes were bound into it."""
    node = next((Path(path) for path in STAND_INS if Path(path).exists()), None)
    if node is None:
        pytest.skip("this host has no character device outside bwrap's own /dev")
    found = probe(lab, sandbox.trainer_identity(*NOBODY), monkeypatch, devices=[node])
    assert node.name in found["dev entries"], found["dev entries"]  # type: ignore[operator]
    assert found["write dev"] != "done", found
