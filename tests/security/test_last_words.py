"""A rank's trainer that says it `stopped` with the others, after rank 0 recorded the stop,
is given the stop's grace to end on its own, its last lines kept (`tests/worker/test_rank_end.py`).
The line is on the stdout user code prints to: a trainer that prints it and runs on must not
be given more than that grace, nor write numbers into a job that has moved on."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sqlalchemy import select

from service.core.models import Job, Metric
from service.core.settings import Settings
from tests.worker.test_rank_end import lines_of, rank_0_moved_on, rank_1_of_a_job_rank_0_has_stopped, steps_of

RUNS_ON = """
import json, time
print(json.dumps({"event": "stopped", "step": 120}), flush=True)
for step in range(121, 100_000):
    print(json.dumps({"event": "metric", "step": step, "loss": 0.5}), flush=True)
    print("still here", flush=True)
    time.sleep(0.05)
"""


def test_a_trainer_that_says_it_stopped_but_runs_on_is_killed_after_the_grace_and_its_numbers_dropped(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    """The line is the trainer's word: one that prints it and goes on gets the stop's grace
    (`cancel_grace_s`) once the job has moved on, no more, and what it reports meanwhile
    is not the job's: no metric point, no step on the job's row."""
    settings = settings.model_copy(update={"cancel_grace_s": 2.0})
    with rank_1_of_a_job_rank_0_has_stopped(settings, add_host, RUNS_ON) as (ctx, runner):
        began = time.monotonic()
        runner._supervise()
        runner._end()
        took = time.monotonic() - began
        assert runner.process is not None and runner.process.returncode == -9, "killed"
        assert 2.0 < took < 10, took
        with ctx.db.read() as session:
            job = session.get(Job, runner.launch.job_id)
            assert job is not None and job.step is None and (job.state, job.attempts) == ("queued", 2)
            assert session.scalars(select(Metric.id).where(Metric.job_id == job.id)).first() is None
        said = [message for _, message in lines_of(ctx, runner.launch.job_id)]
        assert said.count("[rank 1 on lab-a] still here") < 200, "its lines stop with it"


def test_rank_0s_points_after_its_worker_learned_the_job_moved_on_are_not_the_jobs(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    """What rank 0's worker held when another rank's crash moved the job on is still the
    job's (`Report.held`). The trainer's lines from the moment its worker knows are not: a
    trainer that prints on (a step far past what it trained, a better loss) writes nothing
    into the job waiting for its next attempt."""
    with rank_0_moved_on(settings, add_host) as (ctx, runner):
        runner._check(0.0)  # the worker learns that the job moved on: its trainer is killed
        assert runner.sink.moved_on
        for step in (21, 22, 10_000):
            runner._line("out", json.dumps({"event": "metric", "step": step, "loss": 0.0}).encode())
        runner._end()
        assert steps_of(ctx, runner.launch.job_id) == [(1, step) for step in range(1, 21)]
        with ctx.db.read() as session:
            job = session.get(Job, runner.launch.job_id)
            assert job is not None and (job.state, job.step, job.loss) == ("queued", 20, 1.0 / 20)
