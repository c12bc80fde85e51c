"""Which queued jobs' requirements a host builds while they wait (`worker.prepare`): the
waiting ones that could start here, not on hold, in queue order, each list once, at most
so many; on SQLite and PostgreSQL (the spec's JSON is read by the database). A list built
is not built again, and one pip could not install is left for `FAILED_AGAIN_S`; each
waiting job's log hears how its list went, once."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select

from service.core.context import Context
from service.core.db import Database
from service.core.models import Job, LogLine, User
from service.core.settings import Settings
from towerq.contract.paths import job_log
from worker import pyenv
from worker.prepare import FAILED_AGAIN_S, FREE_PCT_KEPT, EnvPreparer, queued_lists


@pytest.fixture
def ctx(settings: Settings, make_token: Callable[..., str]) -> Iterator[Context]:
    make_token("alice")
    context = Context.open(settings)
    yield context
    context.close()


def add_job(db: Database, requirements: list[str] | None, position: int | None, **columns: Any) -> int:
    """A queued command job that waits (a reason) at `position` of the queue."""
    spec: dict[str, Any] = {"command": ["python", "train.py"]}
    if requirements is not None:
        spec["requirements"] = requirements
    with db.write() as session:
        user_id = session.scalars(select(User.id).where(User.name == "alice")).one()
        job = Job(name="j", user_id=user_id, state="queued", spec=spec, priority="normal", gpu_count=1)
        job.gpu_memory_fraction, job.max_attempts, job.attempts = 1.0, 3, 1
        job.queue_position, job.pending_reason = position, "waiting for 1 free GPU"
        for name, value in columns.items():
            setattr(job, name, value)
        session.add(job)
        session.flush()
        return job.id


def lists_of(ctx: Context, host: str, gpus: int, most: int) -> list[list[str]]:
    return [requirements for requirements, _ in queued_lists(ctx, host, gpus, most)]


def said(db: Database, settings: Settings, job_id: int) -> list[tuple[str, str]]:
    """Job `job_id`'s log lines (level, message), as the database has them; `log.txt` has the same."""
    with db.read() as session:
        rows = session.execute(
            select(LogLine.level, LogLine.message).where(LogLine.job_id == job_id).order_by(LogLine.id)
        )
        lines = [(level, message) for level, message in rows]
    file = job_log(settings.artifacts_dir, job_id)
    in_file = file.read_text().splitlines() if file.exists() else []
    assert [line.split(None, 4)[3:] for line in in_file] == [[level, message] for level, message in lines]
    return lines


def failed_on(db: Database, job_id: int) -> list[str] | None:
    with db.read() as session:
        return session.get(Job, job_id).requirements_failed_on  # type: ignore[union-attr]


def reason_of(db: Database, job_id: int) -> str | None:
    with db.read() as session:
        return session.get(Job, job_id).reason  # type: ignore[union-attr]


def test_the_lists_of_waiting_jobs_that_could_start_here_in_queue_order(ctx: Context, db: Database) -> None:
    add_job(db, ["c"], 3)
    first = add_job(db, ["a"], 1)
    add_job(db, None, 0)  # nothing to build
    second = add_job(db, ["a"], 2)  # the same list: once
    add_job(db, ["held"], 0, on_hold_by="alice")
    add_job(db, ["elsewhere"], 0, requested_host="lab-b")
    add_job(db, ["expected-elsewhere"], 0, expected_host="lab-b")
    add_job(db, ["placed-at-once"], 0, pending_reason=None)  # its own attempt builds it, in its log
    add_job(db, ["running"], 0, state="running")
    add_job(db, ["here"], 4, requested_host="lab-a", expected_host="lab-a")
    add_job(db, ["over-hosts"], 5, expected_host="lab-b", gpu_count=8)  # its first host is lab-b; lab-a too
    add_job(db, ["b", "d==1.0"], None)  # not given a position yet: last
    last = add_job(db, ["a"], None)

    assert lists_of(ctx, "lab-a", 4, 10) == [["a"], ["c"], ["here"], ["over-hosts"], ["b", "d==1.0"]]
    assert lists_of(ctx, "lab-a", 4, 2) == [["a"], ["c"]]
    assert queued_lists(ctx, "lab-a", 4, 2)[0] == (["a"], [first, second, last]), "all the jobs of a list taken"
    assert lists_of(ctx, "lab-a", 8, 10) == [["a"], ["c"], ["here"], ["b", "d==1.0"]], "it fits lab-b alone"
    assert lists_of(ctx, "lab-b", 4, 10) == [
        ["elsewhere"], ["expected-elsewhere"], ["a"], ["c"], ["over-hosts"], ["b", "d==1.0"]
    ]  # fmt: skip


def test_a_list_pip_could_not_install_is_left_a_while_and_a_built_one_is_not_built_again(
    ctx: Context, db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = add_job(db, ["broken==9"], 1)
    fine = add_job(db, ["fine"], 2)
    preparer = EnvPreparer(ctx, "lab-a", 4, threading.Event())
    built: list[list[str]] = []
    fails = True

    def build(requirements: list[str]) -> tuple[bool, str]:
        built.append(requirements)
        if requirements == ["broken==9"] and fails:
            return False, "No matching distribution found for broken==9"
        ready = pyenv.env_folder(settings.var_dir, requirements, settings.pip_options) / pyenv.READY
        ready.parent.mkdir(parents=True)
        ready.write_text("{}")
        return True, "installed"

    monkeypatch.setattr(preparer, "build", build)
    assert [preparer.prepare_next() for _ in range(3)] == [["broken==9"], ["fine"], None]
    assert built == [["broken==9"], ["fine"]], "each once: one failed of late, one built"

    ((level, message),) = said(db, settings, broken)
    assert level == "warning" and message.startswith(
        "its requirements could not be installed on lab-a while it waits: No matching distribution found for "
        "broken==9. Unless that changes (lab-a tries again in 10m), it fails with this reason when it starts there"
    ), message
    ((level, message),) = said(db, settings, fine)
    assert level == "info" and message.startswith("its requirements were installed on lab-a while it waits ("), message

    assert reason_of(db, broken) == (
        "its requirements could not be installed on lab-a (its log says why); waiting for 1 free GPU"
    )
    assert reason_of(db, fine) == "waiting for 1 free GPU"

    later = add_job(db, ["broken==9"], 3)  # comes to wait on the list that failed of late: told at the next look
    assert preparer.prepare_next() is None
    assert [level for level, _ in said(db, settings, later)] == ["warning"]
    assert len(said(db, settings, broken)) == 1, "each job told once"
    other = EnvPreparer(ctx, "lab-b", 4, threading.Event())
    monkeypatch.setattr(other, "build", build)
    assert other.prepare_next() == ["broken==9"]
    assert failed_on(db, broken) == failed_on(db, later) == ["lab-a", "lab-b"]

    fails = False
    preparer.failed = {key: (at - FAILED_AGAIN_S, why) for key, (at, why) in preparer.failed.items()}  # 10 min on
    assert preparer.prepare_next() == ["broken==9"]
    for job_id in (broken, later):
        assert [level for level, _ in said(db, settings, job_id)][-1] == "info", "and then that it is built"
        assert failed_on(db, job_id) == ["lab-b"], "lab-a off the reason"
    assert preparer.prepare_next() is None
    assert len(said(db, settings, fine)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small filesystem")
def test_nothing_is_built_ahead_on_a_disk_with_too_little_room(
    ctx: Context, db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The running jobs' folders need the room more: past `FREE_PCT_KEPT`, no build ahead
    (the worker's log says so once), and builds again once there is room."""
    add_job(db, ["fine"], 1)
    root = pyenv.root_of(settings.var_dir)
    root.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "towerq-test-envs", str(root)], check=True)
    try:
        filler = root / "filler"
        filler.write_bytes(b"x" * (1024 * (100 - FREE_PCT_KEPT + 2) // 100 * 1024))
        preparer = EnvPreparer(ctx, "lab-a", 4, threading.Event())
        built: list[list[str]] = []
        monkeypatch.setattr(preparer, "build", lambda requirements: (built.append(requirements), (False, "-"))[1])
        with caplog.at_level(logging.INFO, logger="worker.prepare"):
            assert [preparer.prepare_next() for _ in range(2)] == [None, None]
            assert built == [], "nothing built on a disk this full"
            filler.unlink()
            assert preparer.prepare_next() == ["fine"]
        said = [record.getMessage() for record in caplog.records]
        assert sum("no queued job's requirements built here while" in line for line in said) == 1, said
        assert sum("has room again" in line for line in said) == 1, said
    finally:
        subprocess.run(["umount", str(root)], check=True)
