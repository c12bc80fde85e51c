"""A job's metric points counted toward no limit across its attempts (issue 44): each
attempt may store METRIC_POINTS_PER_ATTEMPT (1,000,000) rows, and a trainer that floods
points and then crashes on purpose is run again up to `max_attempts` times, so one job could
fill the database with ten million rows. Now a job stores at most
TOWERQ_JOB_METRIC_POINTS_MAX points, every attempt together: the rest are dropped and the
job's log says so once."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlalchemy import func, select, update

from service.core.attempts import LocalChannel
from service.core.context import Context
from service.core.models import Job, LogLine, Metric
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from towerq.contract import events
from towerq.contract.spec import JobSpec
from worker.relay import MetricSink

CAP = 50
BODY = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 10_000}}


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url, job_metric_points_max=CAP)


def point(step: int) -> events.Metric:
    return events.Metric.model_validate({"event": "metric", "step": step, "loss": 1.0, "time": time.time()})


def test_a_job_stores_at_most_its_metric_points_over_all_its_attempts(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 1)
    ctx = Context.open(settings)
    try:
        with ctx.db.write() as session:
            user = ensure_user(session, "mallory")
            caller = Caller(user.id, user.name, False, 0)
        job_id = submit(ctx.db, caller, JobSpec.model_validate(BODY), settings)[0].id
        with ctx.db.write() as session:  # as if its earlier attempts had stored 40 points
            session.execute(update(Job).where(Job.id == job_id).values(metric_points=CAP - 10))
        LiveScheduler(ctx).run_pass()
        sink = MetricSink(LocalChannel(ctx, job_id, 1), settings)
        for step in range(1, 31):  # an attempt's flood: 30 points, 10 of which fit
            sink.metric(
                events.Metric.model_validate({"event": "metric", "step": step, "loss": 1.0, "time": time.time()})
            )
        sink.flush(wait=True)
        sink.close()
        with ctx.db.read() as session:
            rows = session.scalar(select(func.count()).select_from(Metric).where(Metric.job_id == job_id))
            counted = session.scalar(select(Job.metric_points).where(Job.id == job_id))
            said = list(session.scalars(select(LogLine.message).where(LogLine.job_id == job_id)))
        assert rows == 10, rows
        assert counted == CAP, counted
        warnings = [m for m in said if "TOWERQ_JOB_METRIC_POINTS_MAX" in m]
        assert warnings == [f"the job stored {CAP:,} metric points (TOWERQ_JOB_METRIC_POINTS_MAX): the rest dropped"]
    finally:
        ctx.close()
