"""A job's latest figures as its program reports them in several calls a step (its loss,
then a metric of its own; a framework's training log, then its evaluation's with the
epoch): a point of metrics of its own alone leaves the loss and accuracy as they were, and
each metric of its own keeps its latest value, whichever point said it. A program that names
new metrics at every step does not grow its job's row past `LATEST_OWN_NAMES` a split."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from service.core.attempts import LocalChannel
from service.core.context import Context
from service.core.models import Job
from service.core.settings import Settings
from tests.security.test_forged_total_steps import running_job
from towerq.contract import events
from worker.latest import LATEST_OWN_NAMES
from worker.relay import MetricSink


def point(**fields: Any) -> events.Metric | events.Eval:
    event = events.decode(json.dumps({"event": "metric", **fields}))
    assert isinstance(event, events.Metric | events.Eval), fields
    return event


@pytest.fixture
def ctx(settings: Settings, add_host: Callable[..., None]) -> Iterator[Context]:
    add_host("lab-a", 1)
    context = Context.open(settings)
    yield context
    context.close()


def latest(ctx: Context, job_id: int) -> Job:
    with ctx.db.read() as session:
        job = session.get(Job, job_id)
    assert job is not None
    return job


def test_a_point_of_metrics_of_its_own_alone_keeps_the_loss_and_adds_to_the_latest(
    ctx: Context, settings: Settings
) -> None:
    job_id = running_job(ctx, settings, command=True)
    sink = MetricSink(LocalChannel(ctx, job_id, 1), settings)
    sink.metric(point(step=4, loss=0.8, accuracy=0.5, metrics={"grad_norm": 0.7, "epoch": 0.4}))
    sink.metric(point(step=4, metrics={"epoch": 0.5}))  # Hugging Face's evaluation log carries the epoch
    sink.metric(point(event="eval", step=4, loss=0.9, metrics={"f1": 0.6}))
    sink.metric(point(event="eval", step=4, metrics={"runtime": 1.5}))
    sink.flush(wait=True)
    sink.metric(point(step=5, metrics={"train_loss": 0.7}))  # after a flush too
    sink.flush(wait=True)
    job = latest(ctx, job_id)
    assert (job.step, job.loss, job.accuracy) == (5, 0.8, 0.5), "the loss stands"
    assert job.custom_metrics == {"grad_norm": 0.7, "epoch": 0.5, "train_loss": 0.7}
    assert (job.eval_loss, job.eval_custom_metrics) == (0.9, {"f1": 0.6, "runtime": 1.5})

    sink.metric(point(step=6, loss=None))  # a loss that was not a number (NaN): said as missing
    for step in range(7, 100):  # a new name at every step
        sink.metric(point(step=step, loss=0.5, metrics={f"m{step}": 1.0}))
    sink.flush(wait=True)
    sink.close()
    job = latest(ctx, job_id)
    assert job.loss == 0.5
    assert list(job.custom_metrics or {}) == [f"m{step}" for step in range(100 - LATEST_OWN_NAMES, 100)]


def test_a_point_with_no_figure_at_all_says_the_loss_is_missing(ctx: Context, settings: Settings) -> None:
    job_id = running_job(ctx, settings, command=True)
    sink = MetricSink(LocalChannel(ctx, job_id, 1), settings)
    sink.metric(point(step=1, loss=0.8))
    sink.metric(point(step=2, loss=None))  # diverged: NaN is stored as missing, and said so
    sink.flush(wait=True)
    sink.close()
    assert (latest(ctx, job_id).step, latest(ctx, job_id).loss) == (2, None)
