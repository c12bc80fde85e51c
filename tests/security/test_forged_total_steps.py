"""A command job's program says how many steps it runs (`towerq.report(total_steps=)`, a
`metric` line's `total_steps`), which gives its job a bar, an ETA and the scheduler a likely
end. The line is the program's word on a stdout user code prints to: a value that is not an
int from 1 below 2**62 is no number of steps (the point is kept without it), and a model
job's count is its spec's, whatever a line its model printed says."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlalchemy import update

from service.core.attempts import LocalChannel
from service.core.context import Context
from service.core.models import Job
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from towerq.contract import events
from towerq.contract.spec import JobSpec
from worker.relay import MetricSink

MODEL_JOB = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 400}}
HOSTILE = [True, 0, -5, 2**62, 2**80, "500", 500.0, 1e300, [500], {"n": 500}, None]


def running_job(ctx: Context, settings: Settings, command: bool) -> int:
    """A running job of mallory's: a model job, or (its stored spec made a command job's) a
    program's."""
    with ctx.db.write() as session:
        user = ensure_user(session, "mallory")
        caller = Caller(user.id, user.name, False, 0)
    job_id = submit(ctx.db, caller, JobSpec.model_validate(MODEL_JOB), settings)[0].id
    if command:
        with ctx.db.write() as session:
            spec = {"command": ["python", "train.py"], "code": "c" * 64, "gpu_count": 1}
            session.execute(update(Job).where(Job.id == job_id).values(spec=spec, total_steps=None))
    LiveScheduler(ctx).run_pass()
    return job_id


def line(step: int, total: object) -> events.Metric:
    event = events.decode(json.dumps({"event": "metric", "step": step, "loss": 0.5, "total_steps": total}))
    assert isinstance(event, events.Metric), event
    return event


@pytest.mark.parametrize("total", HOSTILE, ids=repr)
def test_a_total_that_is_no_number_of_steps_is_dropped_and_the_point_kept(total: object) -> None:
    event = line(7, total)
    assert (event.step, event.loss, event.total_steps) == (7, 0.5, None)


def test_a_model_job_keeps_its_specs_steps_and_a_program_gets_only_what_fits(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    ctx = Context.open(settings)
    try:
        model_job, command_job = running_job(ctx, settings, False), running_job(ctx, settings, True)
        for job_id, attempt in ((model_job, 1), (command_job, 1)):
            sink = MetricSink(LocalChannel(ctx, job_id, attempt), settings)
            for step, total in enumerate([*HOSTILE, 3], start=1):  # the model's forged line, last
                sink.metric(line(step, total))
            sink.flush(wait=True)
            sink.close()
        with ctx.db.read() as session:
            model, command = session.get(Job, model_job), session.get(Job, command_job)
            assert model is not None and command is not None
            assert model.total_steps == 400, "a model job's steps are its spec's"
            assert command.total_steps == 3 and command.step == len(HOSTILE) + 1
    finally:
        ctx.close()
