"""A rank of a job over two hosts whose trainer is a hand-written script: the runner of
that rank, set up as its worker would (the job submitted and placed on lab-a), with the
script started in its place. Tests of how a rank ends (tests/worker/test_rank_end.py) and
of what a rank's forged lines can do (tests/security/test_forged_peer_lost.py) share it."""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import select as query

from service.core.context import Context
from service.core.models import LogLine
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from towerq.contract.spec import JobSpec
from worker.inventory import SimulatedInventory
from worker.launch import read_launch
from worker.runner import JobRunner


@contextmanager
def a_rank(
    settings: Settings, add_host: Callable[..., None], trainer: str, rank: int
) -> Iterator[tuple[Context, JobRunner]]:
    """The runner of `rank` (on lab-a) of a job over two hosts, its trainer running `trainer`
    (a script) without a sandbox, once it printed its first line (not read yet)."""
    add_host("lab-a", 2)
    ctx = Context.open(settings.model_copy(update={"trainer_pool": 0, "sandbox": "none"}))
    runner: JobRunner | None = None
    try:
        with ctx.db.write() as session:
            user = ensure_user(session, "alice")
            alice = Caller(user.id, user.name, False, 0)
        spec = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "gpus": [0], "host": "lab-a"})
        job_id = submit(ctx.db, alice, spec, settings)[0].id
        LiveScheduler(ctx).run_pass()
        launch = read_launch(ctx, job_id, 1, "lab-a")
        launch.rank, launch.hosts = rank, ["lab-a", "lab-b"] if rank == 0 else ["lab-b", "lab-a"]
        runner = JobRunner(ctx, SimulatedInventory("lab-a", 2), launch, lambda _: None)
        process = subprocess.Popen(
            [sys.executable, "-c", trainer], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        runner.process, runner.trainer_pids = process, {process.pid}
        assert process.stdout is not None and select.select([process.stdout], [], [], 30)[0], "its first line"
        yield ctx, runner
    finally:
        if runner is not None and runner.process is not None and runner.process.poll() is None:
            runner.process.kill()
            runner.process.wait()
        ctx.close()


def lines_of(ctx: Context, job_id: int) -> list[tuple[int, str]]:
    with ctx.db.read() as session:
        rows = session.execute(query(LogLine.attempt, LogLine.message).where(LogLine.job_id == job_id)).all()
    return [(attempt, message) for attempt, message in rows]
