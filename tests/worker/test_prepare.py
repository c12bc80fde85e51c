"""Which queued jobs' requirements a host builds while they wait (`worker.prepare`): the
waiting ones that could start here, not on hold, in queue order, each list once, at most
so many; on SQLite and PostgreSQL (the spec's JSON is read by the database). A list built
is not built again, and one pip could not install is left for `FAILED_AGAIN_S`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select

from service.core.context import Context
from service.core.db import Database
from service.core.models import Job, User
from service.core.settings import Settings
from worker import pyenv
from worker.prepare import FAILED_AGAIN_S, EnvPreparer, queued_lists


@pytest.fixture
def ctx(settings: Settings, make_token: Callable[..., str]) -> Iterator[Context]:
    make_token("alice")
    context = Context.open(settings)
    yield context
    context.close()


def add_job(db: Database, requirements: list[str] | None, position: int | None, **columns: Any) -> None:
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


def test_the_lists_of_waiting_jobs_that_could_start_here_in_queue_order(ctx: Context, db: Database) -> None:
    add_job(db, ["c"], 3)
    add_job(db, ["a"], 1)
    add_job(db, None, 0)  # nothing to build
    add_job(db, ["a"], 2)  # the same list: once
    add_job(db, ["held"], 0, on_hold_by="alice")
    add_job(db, ["elsewhere"], 0, requested_host="lab-b")
    add_job(db, ["expected-elsewhere"], 0, expected_host="lab-b")
    add_job(db, ["placed-at-once"], 0, pending_reason=None)  # its own attempt builds it, in its log
    add_job(db, ["running"], 0, state="running")
    add_job(db, ["here"], 4, requested_host="lab-a", expected_host="lab-a")
    add_job(db, ["over-hosts"], 5, expected_host="lab-b", gpu_count=8)  # its first host is lab-b; lab-a too
    add_job(db, ["b", "d==1.0"], None)  # not given a position yet: last

    assert queued_lists(ctx, "lab-a", 4, 10) == [["a"], ["c"], ["here"], ["over-hosts"], ["b", "d==1.0"]]
    assert queued_lists(ctx, "lab-a", 4, 2) == [["a"], ["c"]]
    assert queued_lists(ctx, "lab-a", 8, 10) == [["a"], ["c"], ["here"], ["b", "d==1.0"]], "it fits lab-b alone"
    assert queued_lists(ctx, "lab-b", 4, 10) == [
        ["elsewhere"], ["expected-elsewhere"], ["a"], ["c"], ["over-hosts"], ["b", "d==1.0"]
    ]  # fmt: skip


def test_a_list_pip_could_not_install_is_left_a_while_and_a_built_one_is_not_built_again(
    ctx: Context, db: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_job(db, ["broken==9"], 1)
    add_job(db, ["fine"], 2)
    preparer = EnvPreparer(ctx, "lab-a", 4, threading.Event())
    built: list[list[str]] = []

    def build(requirements: list[str]) -> bool:
        built.append(requirements)
        if requirements == ["broken==9"]:
            return False
        ready = pyenv.env_folder(settings.var_dir, requirements, settings.pip_options) / pyenv.READY
        ready.parent.mkdir(parents=True)
        ready.write_text("{}")
        return True

    monkeypatch.setattr(preparer, "build", build)
    assert [preparer.prepare_next() for _ in range(3)] == [["broken==9"], ["fine"], None]
    assert built == [["broken==9"], ["fine"]], "each once: one failed of late, one built"
    preparer.failed = {key: at - FAILED_AGAIN_S for key, at in preparer.failed.items()}  # ten minutes on
    assert preparer.prepare_next() == ["broken==9"]
