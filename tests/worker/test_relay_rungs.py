"""A setting of an adaptive sweep that reports at a rung asks the scheduler to decide now
(`keys.SWEEPS_DUE` with a kick), not at its next look every 2 s: a setting left behind
frees its GPU that much sooner (`bench/asha.py`: the look was 1-2.5 s of a stopped
setting's 5-10 s). Only the sweep's metric's rows count (its evaluations, for an `eval_`
metric), and each rung once: a trainer's lines ask for at most one look a rung."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import update

from service.core import keys
from service.core.attempts import LocalChannel
from service.core.context import Context
from service.core.models import Job, Sweep
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from towerq.contract import events
from towerq.contract.spec import JobSpec
from worker.relay import MetricSink

EARLY = {"method": "asha", "min_steps": 50, "reduction_factor": 2, "max_steps": None}
BODY = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 400, "eval_every": 50}}


def running_job(ctx: Context, settings: Settings, name: str, early: dict | None) -> int:
    """A running job of `name`'s (400 steps, an evaluation every 50) in a sweep, adaptive
    with `early` as its early_stopping where that is given."""
    with ctx.db.write() as session:
        user = ensure_user(session, name)
        caller = Caller(user.id, user.name, False, 0)
        sweep = Sweep(name="s", user_id=user.id, spec={"metric": "eval_accuracy", "early_stopping": early}, grid={})
        session.add(sweep)
        session.flush()
        sweep_id = sweep.id
    job_id = submit(ctx.db, caller, JobSpec.model_validate(BODY), settings)[0].id
    with ctx.db.write() as session:
        session.execute(update(Job).where(Job.id == job_id).values(sweep_id=sweep_id))
    LiveScheduler(ctx).run_pass()
    return job_id


def test_a_setting_at_a_rung_asks_for_the_sweeps_decision_once_a_rung(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 1)
    ctx = Context.open(settings)
    try:
        sink = MetricSink(LocalChannel(ctx, running_job(ctx, settings, "alice", EARLY), 1), settings)

        def asks(*points: tuple[str, int]) -> bool:
            ctx.redis.delete(keys.SWEEPS_DUE, keys.SCHEDULER_KICK)
            for kind, step in points:
                line = {"event": kind, "step": step, "accuracy": 0.5, "time": time.time()}
                event = events.Metric if kind == "metric" else events.Eval
                sink.metric(event.model_validate(line))
            sink.flush(wait=True)
            due = ctx.redis.get(keys.SWEEPS_DUE) is not None
            assert due == bool(ctx.redis.llen(keys.SCHEDULER_KICK)), "the look comes with a pass"
            return due

        # rungs at 50, 100, 200 (400 steps, factor 2)
        assert not asks(("metric", 40), ("eval", 40))
        assert not asks(("metric", 50))  # a train row: the sweep ranks by its evaluations
        assert asks(("eval", 50))
        assert not asks(("metric", 60), ("eval", 60), ("eval", 50))
        assert asks(("eval", 150))  # past 100: once, though it is short of 200
        assert not asks(("eval", 160))
        assert asks(("eval", 200))
        assert not asks(("eval", 350))  # no rung left
        sink.close()
    finally:
        ctx.close()


def test_a_job_in_no_adaptive_sweep_never_asks(settings: Settings, add_host: Callable[..., None]) -> None:
    add_host("lab-a", 1)
    ctx = Context.open(settings)
    try:
        sink = MetricSink(LocalChannel(ctx, running_job(ctx, settings, "bob", None), 1), settings)
        ctx.redis.delete(keys.SWEEPS_DUE)
        for step in (50, 100, 200):
            sink.metric(events.Eval.model_validate({"event": "eval", "step": step, "accuracy": 0.5}))
        sink.flush(wait=True)
        assert ctx.redis.get(keys.SWEEPS_DUE) is None
        sink.close()
    finally:
        ctx.close()
