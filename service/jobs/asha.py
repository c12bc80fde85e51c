"""Adaptive sweeps: stop the losing settings early (asynchronous successive halving, ASHA;
Li et al., MLSys 2020), in its stop-based form.

A sweep with `early_stopping: {method: asha, min_steps: m, reduction_factor: r}` has rungs at
steps m, m·r, m·r², ... below the settings' steps. A setting that reaches a rung (its first
report of the sweep's metric at or past the rung's step) is compared with the settings that
reached that rung before it: it goes on if it is among the best max(1, n // r) of the n there
so far (itself counted), else it is stopped, with the reason, its GPUs freed at once and its
checkpoint and metrics kept. A setting that failed or was cancelled before a rung counts as
the worst there. Every decision is a row (`SweepRung`), written once, in the transaction that
stops the job: the rows are the searcher's whole state, so a restarted scheduler decides the
same, and a decision is never taken twice.

The scheduler runs `decide` after a pass: at once when a worker wrote a setting's report at
a rung (`keys.SWEEPS_DUE`, `worker.relay`), and every `CHECK_S` (`service.cli.scheduling`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Self

from pydantic import BaseModel, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.db import Database
from service.core.exceptions import SpecError
from service.core.lifecycle import locked_job, request_cancel
from service.core.models import FINAL_STATES, Job, JobState, Metric, Sweep, SweepRung
from service.core.results import metric_split, rung_steps
from service.executors import Executor
from service.jobs.stopping import cancel_then_stop
from towerq.contract.messages import CancelMessage
from towerq.contract.spec import JobSpec

FINAL = tuple(state.value for state in FINAL_STATES)
CHECK_S = 2.0
"""How often the scheduler looks for settings that reached a rung, besides when a worker
says one did (and for settings that ended before a rung)."""


class EarlyStopping(BaseModel):
    """A sweep's `early_stopping`."""

    model_config = {"extra": "forbid"}

    method: Literal["asha"] = "asha"
    min_steps: int = Field(ge=1, le=100_000_000, description="the first rung's step")
    reduction_factor: int = Field(default=3, ge=2, le=100, description="each rung keeps 1 in this many")
    max_steps: int | None = Field(
        default=None,
        ge=2,
        le=100_000_000,
        description="the steps a setting trains (default: hyperparameters.steps; a command job must say)",
    )

    @model_validator(mode="after")
    def _below(self) -> Self:
        if self.max_steps is not None and self.min_steps >= self.max_steps:
            raise ValueError("min_steps must be below max_steps")
        return self

    def rungs(self, steps: int) -> list[int]:
        """The rungs' steps for a setting of `steps` steps: m, m·r, ... below `steps`."""
        top = min(steps, self.max_steps) if self.max_steps is not None else steps
        return rung_steps(self.min_steps, self.reduction_factor, top)


def check_setting(early: EarlyStopping, spec: JobSpec, metric: str) -> None:
    """SpecError (naming the field) when a setting could never be compared at a rung: its
    steps end before the first, or, for a job of towerq's trainer, no metric row lands on a
    rung (an evaluation every `eval_every` steps for an `eval_` metric, else a row every
    `log_every`). A command job reports when it reports: its value at a rung is its first
    report at or past it."""
    if spec.is_command and early.max_steps is None:
        raise SpecError(
            "early_stopping.max_steps",
            "a command job's steps are its program's: give the steps each setting reports to",
        )
    steps = early.max_steps or spec.hyperparameters.steps
    rungs = early.rungs(steps)
    if not rungs:
        raise SpecError(
            "early_stopping.min_steps", f"{early.min_steps} is not below the {steps} steps a setting trains"
        )
    if spec.is_command:
        return
    hyper = spec.hyperparameters
    every, what = (
        (hyper.eval_every or 0, "eval_every") if metric.startswith("eval_") else (hyper.log_every, "log_every")
    )
    missed = [rung for rung in rungs if every == 0 or rung % every]
    if missed:
        lands = "only at the end" if every == 0 else f"at steps {every}, {2 * every}, {3 * every}, ..."
        raise SpecError(
            "early_stopping.min_steps",
            f"the rung at step {missed[0]} has no {metric} to compare: {what} {every} gives it {lands}; "
            f"give min_steps a multiple of {what}",
        )


@dataclass(frozen=True)
class Arrival:
    """A setting at a rung: its value there (None: it ended before, the worst)."""

    job_id: int
    rung: int
    step: int
    value: float | None
    at: datetime


def better(a: float | None, b: float | None, goal: str) -> bool:
    """Whether `a` is strictly better than `b` (None is the worst)."""
    if a is None:
        return False
    if b is None:
        return True
    return a > b if goal == "max" else a < b


def judge(
    earlier: Sequence[float | None], value: float | None, goal: str, reduction_factor: int
) -> tuple[bool, float | None]:
    """(goes on, the rung's cut) for a setting reaching a rung with `value`, after `earlier`
    settings did: it goes on when fewer than max(1, n // r) of the n there are better."""
    everyone = [*earlier, value]
    keep = max(1, len(everyone) // reduction_factor)
    ahead = sum(1 for other in earlier if better(other, value, goal))
    ranked = sorted(everyone, key=lambda v: (v is None, 0.0 if v is None else -v if goal == "max" else v))
    return ahead < keep, ranked[keep - 1]


# -- in the service ------------------------------------------------------------------------


def metric_value(point: Metric, metric: str) -> float | None:
    """The sweep's metric in one metric row of its split."""
    name = metric.removeprefix("eval_")
    value: Any = getattr(point, name, None) if name in ("loss", "accuracy") else (point.custom or {}).get(name)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def first_report(session: Session, job_id: int, metric: str, step: int) -> Metric | None:
    """The job's first row of the metric's split at or past `step` that holds the metric."""
    rows = session.scalars(
        select(Metric)
        .where(Metric.job_id == job_id, Metric.split == metric_split(metric), Metric.step >= step)
        .order_by(Metric.step)
        .limit(8)
    )
    return next((row for row in rows if metric_value(row, metric) is not None), None)


def arrivals(
    session: Session, sweep: Sweep, early: EarlyStopping, recorded: dict[int, dict[int, SweepRung]]
) -> list[Arrival]:
    """The settings that reached a rung (or ended before one) and have no decision there yet."""
    metric = sweep.spec["metric"]
    found = []
    for job in session.scalars(select(Job).where(Job.sweep_id == sweep.id, Job.started_at.is_not(None))):
        mine = recorded.get(job.id, {})
        if any(row.stopped or row.value is None for row in mine.values()):
            continue  # stopped, or counted as the worst where it ended: nothing more to decide
        top = early.max_steps or job.total_steps  # a command job's sweep has max_steps (submit)
        for rung, step in enumerate(early.rungs(top) if top else []):
            if rung in mine:
                continue
            point = first_report(session, job.id, metric, step)
            if point is not None:
                found.append(Arrival(job.id, rung, point.step, metric_value(point, metric), point.time))
                continue
            if job.state in (JobState.FAILED.value, JobState.CANCELLED.value) and job.finished_at is not None:
                found.append(Arrival(job.id, rung, step, None, job.finished_at))
            break  # not there yet (or it ended): no later rung either
    return sorted(found, key=lambda a: (a.at, a.rung, a.job_id))


def recorded_rungs(session: Session, sweep_id: int) -> dict[int, dict[int, SweepRung]]:
    """The sweep's decisions so far, by job and rung."""
    recorded: dict[int, dict[int, SweepRung]] = {}
    for row in session.scalars(select(SweepRung).where(SweepRung.sweep_id == sweep_id)):
        recorded.setdefault(row.job_id, {})[row.rung] = row
    return recorded


def pending(session: Session, sweep: Sweep) -> bool:
    """Whether a setting of the sweep reached a rung (or ended before one) undecided."""
    early = EarlyStopping.model_validate(sweep.spec["early_stopping"])
    return bool(arrivals(session, sweep, early, recorded_rungs(session, sweep.id)))


def decide_sweep(session: Session, sweep: Sweep) -> list[CancelMessage]:
    """Decide every setting of one adaptive sweep that reached a rung; stop the losers."""
    early = EarlyStopping.model_validate(sweep.spec["early_stopping"])
    metric, goal = sweep.spec["metric"], sweep.spec["goal"]
    recorded = recorded_rungs(session, sweep.id)
    stopping = []
    for arrival in arrivals(session, sweep, early, recorded):
        if any(row.stopped for row in recorded.get(arrival.job_id, {}).values()):
            continue  # stopped at an earlier rung in this same round
        earlier = [rows[arrival.rung].value for rows in recorded.values() if arrival.rung in rows]
        goes_on, cut = judge(earlier, arrival.value, goal, early.reduction_factor)
        row = SweepRung(
            sweep_id=sweep.id,
            job_id=arrival.job_id,
            rung=arrival.rung,
            step=arrival.step,
            value=arrival.value,
            stopped=arrival.value is not None and not goes_on,
            cut=cut,
            reached_at=arrival.at,
        )
        session.add(row)
        recorded.setdefault(arrival.job_id, {})[arrival.rung] = row
        if not row.stopped:
            continue
        job = locked_job(session, arrival.job_id)
        if job.state in FINAL or job.cancel_requested_at is not None:
            continue
        reason = (
            f"stopped early by sweep {sweep.id} at rung {arrival.rung + 1} (step {arrival.step}): "
            f"{metric} {arrival.value:.4g}, the rung's cut {cut:.4g}"
        )
        if message := request_cancel(session, job, f"sweep {sweep.id}", reason=reason):
            stopping.append(message)
    return stopping


def decide(db: Database, executor: Executor) -> int:
    """Decide the rungs of every adaptive sweep with a job not yet ended; how many settings
    it stopped. Read first; a sweep with something to decide in a write transaction of its own."""
    with db.read() as session:
        active = select(Job.sweep_id).where(Job.sweep_id.is_not(None), Job.state.not_in(FINAL)).distinct()
        adaptive = []
        for sweep in session.scalars(select(Sweep).where(Sweep.id.in_(active))):
            if sweep.spec.get("early_stopping") and pending(session, sweep):
                adaptive.append(sweep.id)
    stopped: list[CancelMessage] = []
    for sweep_id in adaptive:

        def ask(session: Session, sweep_id: int = sweep_id) -> list[CancelMessage]:
            sweep = session.get(Sweep, sweep_id)
            messages = decide_sweep(session, sweep) if sweep is not None else []
            stopped.extend(messages)
            return messages

        cancel_then_stop(db, executor, ask)
    return len(stopped)
