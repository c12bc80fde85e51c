"""Sweeps: many settings of one job spec, launched from one request and followed as one.

A sweep is a `base` job spec and either a `grid` (`{"hyperparameters.learning_rate": [0.1,
0.01], ...}`: the cartesian product) or `random` settings (`{"count": 20, "space":
{"hyperparameters.learning_rate": {"log_uniform": [1e-4, 1e-1]}, ...}}`). Every setting is
made into a job spec and checked like a submission before anything is stored; then the
sweep and all its jobs are stored. `early_stopping` stops the settings behind the others at
rungs (`service.jobs.asha`). `max_parallel` holds the rest of a sweep's jobs in the
queue while that many of them hold GPUs (the scheduler reads `service.scheduler.holdbacks.held_by_sweeps`); `metric`
and `goal` name the best job.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
from typing import Any, Self

from pydantic import BaseModel, Field, ValidationError, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from service.core.db import Database
from service.core.exceptions import NotFoundError, SpecError
from service.core.lifecycle import locked_job, request_cancel
from service.core.models import FINAL_STATES, Job, Sweep
from service.core.publish import kick_scheduler
from service.core.settings import Settings
from service.executors import Executor
from service.jobs.asha import EarlyStopping, check_setting
from service.jobs.intake import Submission, insert_submissions
from service.jobs.stopping import cancel_then_stop
from service.jobs.submit import check_queue_room, submission_row
from service.lab.auth import Caller
from service.lab.hosts import HostInventory
from service.notifications import outbound
from towerq.contract.messages import CancelMessage
from towerq.contract.spec import NO_CONTROL, JobSpec, problem, set_dotted

MAX_JOBS_PER_SWEEP = 1000
METRICS = ("eval_accuracy", "eval_loss", "accuracy", "loss")
FINAL = tuple(state.value for state in FINAL_STATES)


class Distribution(BaseModel):
    """One dimension of a random search: exactly one of these."""

    model_config = {"extra": "forbid"}

    uniform: tuple[float, float] | None = None
    log_uniform: tuple[float, float] | None = None
    int_uniform: tuple[int, int] | None = None
    choice: list[Any] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> Self:
        given = [
            name for name in ("uniform", "log_uniform", "int_uniform", "choice") if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError("give exactly one of uniform, log_uniform, int_uniform, choice")
        if self.log_uniform is not None and not 0 < self.log_uniform[0] <= self.log_uniform[1]:
            raise ValueError("log_uniform needs 0 < low <= high")
        for bounds in (self.uniform, self.int_uniform):
            if bounds is not None and bounds[0] > bounds[1]:
                raise ValueError("low must not exceed high")
        return self

    def draw(self, rng: random.Random) -> Any:
        if self.uniform is not None:
            return rng.uniform(*self.uniform)
        if self.log_uniform is not None:
            return math.exp(rng.uniform(math.log(self.log_uniform[0]), math.log(self.log_uniform[1])))
        if self.int_uniform is not None:
            return rng.randint(*self.int_uniform)
        assert self.choice is not None
        return rng.choice(self.choice)


class RandomSearch(BaseModel):
    model_config = {"extra": "forbid"}

    count: int = Field(ge=1, le=MAX_JOBS_PER_SWEEP)
    space: dict[str, Distribution] = Field(min_length=1)
    seed: int = 0


class SweepIn(BaseModel):
    """A sweep as submitted."""

    model_config = {"extra": "forbid"}

    name: str = Field(min_length=1, max_length=100, pattern=NO_CONTROL)
    base: dict[str, Any]
    grid: dict[str, list[Any]] | None = None
    random: RandomSearch | None = None
    metric: str = Field(
        default="eval_accuracy",
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,52}$",
        description=(
            "eval_accuracy, eval_loss, accuracy, loss, or a metric the jobs report by name (f1; eval_f1 for the "
            "evaluation's)"
        ),
    )
    goal: str = Field(default="max", pattern=r"^(max|min)$")
    max_parallel: int | None = Field(default=None, ge=1, le=MAX_JOBS_PER_SWEEP)
    early_stopping: EarlyStopping | None = Field(
        default=None, description="stop the settings behind the others at rungs (ASHA: service.jobs.asha)"
    )
    notify_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://[^\s]+$")

    @model_validator(mode="after")
    def _grid_or_random(self) -> Self:
        if (self.grid is None) == (self.random is None):
            raise ValueError("give a grid or a random search (one of them)")
        if self.grid is not None:
            if not self.grid or any(not values for values in self.grid.values()):
                raise ValueError("grid: each field needs at least one value")
            size = math.prod(len(values) for values in self.grid.values())
            if size > MAX_JOBS_PER_SWEEP:
                raise ValueError(f"grid: {size} settings; a sweep has at most {MAX_JOBS_PER_SWEEP}")
        return self

    def settings(self) -> list[dict[str, Any]]:
        """Each job's values for the swept fields, in order."""
        if self.grid is not None:
            fields = list(self.grid)
            return [dict(zip(fields, values, strict=True)) for values in itertools.product(*self.grid.values())]
        assert self.random is not None
        rng = random.Random(self.random.seed)
        return [{f: d.draw(rng) for f, d in self.random.space.items()} for _ in range(self.random.count)]


def job_specs(sweep: SweepIn) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(setting, the job spec it makes) for each setting; each spec named after its setting.
    A command job's setting goes into its `{name}` placeholders in `command` (`--lr {lr}`),
    or into its environment (`env.LR`, as text)."""
    made = []
    for index, setting in enumerate(sweep.settings()):
        spec = copy.deepcopy(sweep.base)
        for path, value in setting.items():
            if _fills_placeholder(spec, path, value):
                continue
            try:
                set_dotted(spec, path, _as_text(value) if path.startswith("env.") else value)
            except ValueError as err:
                raise SpecError(path, str(err)) from None
        label = " ".join(f"{path.rsplit('.', 1)[-1]}={_short(value)}" for path, value in setting.items())
        spec["name"] = f"{sweep.name} {label}"[:128] if label else f"{sweep.name} #{index + 1}"
        made.append((setting, spec))
    return made


def _fills_placeholder(spec: dict[str, Any], name: str, value: Any) -> bool:
    """Put `value` where the command says `{name}`; False when no argument says it."""
    command = spec.get("command")
    marker = "{" + name + "}"
    if not isinstance(command, list) or not any(isinstance(arg, str) and marker in arg for arg in command):
        return False
    spec["command"] = [arg.replace(marker, _as_text(value)) if isinstance(arg, str) else arg for arg in command]
    return True


def _as_text(value: Any) -> str:
    """A setting as a program reads it: every digit of a float (`repr`), JSON for the rest."""
    return repr(value) if isinstance(value, float) else value if isinstance(value, str) else json.dumps(value)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def refusal(index: int, setting: dict[str, Any], err: ValidationError | SpecError) -> SpecError:
    """A setting's spec that does not validate, as an error naming the setting and its field.
    The field's path holds the setting's place (`settings.1.hyperparameters.steps`, counted
    from 0 like every path); the message names the setting by its values, not again by place."""
    where = ", ".join(f"{k}={_short(v)}" for k, v in setting.items())
    if isinstance(err, SpecError):
        return SpecError(f"settings.{index}.{err.field}", f"with {where}: {err.message}")
    field, message = problem(err.errors()[0])
    return SpecError(f"settings.{index}.{field}" if field else f"settings.{index}", f"with {where}: {message}")


def create_sweep(
    db: Database,
    caller: Caller,
    body: SweepIn,
    settings: Settings,
    inventory: HostInventory,
) -> int:
    """Every setting becomes a job spec, checked like a submission before anything is
    stored (a refusal names the setting); then the sweep and its jobs (queued) are stored,
    in one transaction. The sweep's id."""
    if body.notify_url:
        outbound.check_url(body.notify_url, settings.webhook_allow)
    checked: list[tuple[dict[str, Any], dict[str, Any]]] = []  # each setting and its job's row
    for index, (setting, raw) in enumerate(job_specs(body)):
        try:
            spec = JobSpec.model_validate(raw)
            if spec.is_notebook:
                raise SpecError("kind", "a sweep runs jobs, not notebook sessions")
            # Everything submit checks, the database's part too, before anything is stored.
            row = submission_row(db, caller, spec, settings, inventory=inventory, in_sweep=True)
        except (ValidationError, SpecError) as err:
            raise refusal(index, setting, err) from None
        if body.early_stopping is not None:  # its rungs: the error names early_stopping's field
            check_setting(body.early_stopping, spec, body.metric)
        checked.append((setting, row))
    check_queue_room(db, caller, len(checked), settings.user_max_queued_jobs)
    definition = {"grid": body.grid} if body.grid is not None else {"random": body.random.model_dump()}  # type: ignore[union-attr]
    with db.write() as session:  # the sweep and all its jobs, or nothing: never a sweep short of a job
        sweep = Sweep(
            name=body.name,
            user_id=caller.user_id,
            spec={
                "base": body.base,
                "metric": body.metric,
                "goal": body.goal,
                "max_parallel": body.max_parallel,
                "early_stopping": body.early_stopping.model_dump() if body.early_stopping else None,
                "notify_url": body.notify_url,
                "settings": [setting for setting, _ in checked],
            },
            grid=definition,
        )
        session.add(sweep)
        session.flush()
        for _, row in checked:
            row["sweep_id"] = sweep.id
        insert_submissions(session, [Submission(row, caller.name) for _, row in checked])
        kick_scheduler(session)
        return sweep.id


def cancel_sweep(db: Database, caller: Caller, sweep_id: int, executor: Executor) -> None:
    """Cancel every unfinished job of the sweep (its owner or an admin)."""

    def ask(session: Session) -> list[CancelMessage]:
        sweep = get_sweep(session, sweep_id)
        caller.check_owner(sweep.user_id, f"sweep {sweep_id}", sweep.user.name, "cancel")
        unfinished = session.scalars(
            select(Job.id).where(Job.sweep_id == sweep_id, Job.state.not_in(FINAL)).order_by(Job.id)
        ).all()
        stopping = []
        for job_id in unfinished:
            job = locked_job(session, job_id)
            if job.state not in FINAL and job.cancel_requested_at is None:
                if message := request_cancel(session, job, caller.name):
                    stopping.append(message)
        kick_scheduler(session)
        return stopping

    cancel_then_stop(db, executor, ask)


def get_sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.scalars(select(Sweep).options(joinedload(Sweep.user)).where(Sweep.id == sweep_id)).one_or_none()
    if sweep is None:
        raise NotFoundError(f"sweep {sweep_id} not found")
    return sweep
