#!/usr/bin/env python3
"""A lab with a week of history, for looking at the dashboard and the CLI as a member would:
five members, two hosts of four simulated GPUs, a few hundred jobs (succeeded, failed with
real-looking errors, cancelled, running now, waiting with their reasons), their metric curves,
GPU allocations, events and two sweeps.

    python scripts/seed-lab.py [--database-url URL] [--jobs 300] [--seed 7]

It writes rows straight into a migrated database (the default: TOWERQ_DATABASE_URL, as
`towerq up` uses it), through the service's own row maker and host registration; nothing
trains. Run it on an empty database: it adds, it does not replace. The same seed gives the
same lab, its times counted back from now. `scripts/screenshots.py` uses it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import select  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from service.core import rollups  # noqa: E402
from service.core.db import Database  # noqa: E402
from service.core.models import (  # noqa: E402
    Allocation,
    Gpu,
    Group,
    GroupMember,
    Host,
    Job,
    JobEvent,
    JobState,
    Metric,
    Reservation,
    Sweep,
    utcnow,
)
from service.core.settings import Settings  # noqa: E402
from service.jobs.submit import new_job  # noqa: E402
from service.lab.auth import Caller, ensure_user  # noqa: E402
from towerq.contract.spec import JobSpec  # noqa: E402
from worker.host import register  # noqa: E402
from worker.inventory import SimulatedInventory  # noqa: E402

MEMBERS = {"alice": 0.35, "bob": 0.25, "carol": 0.2, "dave": 0.12, "erin": 0.08}
"""Who submits how much of the lab's work."""
GROUPS = {"vision": (2.0, ("alice", "bob")), "nlp": (1.0, ("carol", "dave", "erin"))}
"""The lab's groups: share and members (each member's only group, so their default)."""
HOSTS = {"lab-a": 4, "lab-b": 4}
MODELS = [
    ("mlp", "digits"),
    ("lenet5", "digits"),
    ("lenet5", "fashion_mnist"),
    ("resnet20", "synthetic"),
    ("cifar_cnn", "synthetic"),
]
ERRORS = [
    "model nets:build: ValueError: the layer sizes do not match (got 784, expected 1024)\n"
    'Traceback (most recent call last):\n  File "nets.py", line 41, in build\n    ...',
    "the loss became NaN at step {step:,} (learning rate 0.3): lower it, or clip gradients",
    "out of memory at step {step:,}: a tower's batch of 512 does not fit; try a smaller batch_size",
    "dataset users/dave/faces: no such dataset (upload it with towerq data upload)",
    "time limit of 2h reached at step {step:,}",
]
WAITING = [
    "waiting for 2 free GPUs on lab-a (job {other}, ends ~{clock})",
    "user limit: {user} uses 4 of 4 GPUs",
    "no host has 4 free GPUs; reserved from ~{clock}",
    "sweep {sweep} runs at most 2 of its jobs at once",
]
LOG_EVERY = 50


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="default: TOWERQ_DATABASE_URL")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    settings = Settings(**({"database_url": args.database_url} if args.database_url else {}))
    db = Database(settings.database_url)
    try:
        made = seed(db, settings, args.jobs, random.Random(args.seed))
    finally:
        db.dispose()
    print(f"seeded {made} jobs of {len(MEMBERS)} members on {len(HOSTS)} hosts into {settings.database_url}")
    return 0


def seed(db: Database, settings: Settings, count: int, rng: random.Random) -> int:
    now = utcnow()
    with db.write() as session:
        gpus = _hosts(session)
        callers = {name: _member(session, name) for name in MEMBERS}
        _groups(session, callers, now)
        sweeps = [_sweep(session, callers["carol"], "lr-search", now), _sweep(session, callers["bob"], "depth", now)]
        span = timedelta(days=7) * count / 300  # as busy a lab at any size: 300 jobs a week
        free_at = {gpu.id: now - span for gpu in gpus}
        made = 0
        for index in range(count):
            made += _job(session, settings, rng, callers, sweeps, gpus, free_at, now - span * (1 - index / count))
    return made


def _hosts(session: Session) -> list[Gpu]:
    for name, size in HOSTS.items():
        register(session, name, SimulatedInventory(name, size), {"seeded": True})
    session.flush()
    return list(session.scalars(select(Gpu).join(Host).order_by(Host.name, Gpu.index)))


def _groups(session: Session, callers: dict[str, Caller], now: datetime) -> None:
    """The groups, and two GPUs of lab-b kept for nlp tomorrow afternoon."""
    for name, (share, members) in GROUPS.items():
        group = Group(name=name, share=share, max_gpu_hours_week=400.0 if name == "nlp" else None)
        session.add(group)
        for member in members:
            session.add(GroupMember(group=group, user_id=callers[member].user_id, is_default=True))
    start = (now + timedelta(days=1)).replace(hour=13, minute=0, second=0, microsecond=0)
    session.add(Reservation(group="nlp", gpus=[["lab-b", 2], ["lab-b", 3]], start_at=start,
                            end_at=start + timedelta(hours=5), note="paper deadline", created_by="admin"))  # fmt: skip
    session.flush()


def _member(session: Session, name: str) -> Caller:
    user = ensure_user(session, name)
    session.flush()
    return Caller(user.id, user.name, False, 0)


def _sweep(session: Session, caller: Caller, name: str, now: datetime) -> Sweep:
    sweep = Sweep(name=name, user_id=caller.user_id, spec={"metric": "eval_accuracy", "goal": "max", "settings": []},
                  grid={}, created_at=now - timedelta(days=2))  # fmt: skip
    session.add(sweep)
    session.flush()
    return sweep


def _job(
    session: Session,
    settings: Settings,
    rng: random.Random,
    callers: dict[str, Caller],
    sweeps: list[Sweep],
    gpus: list[Gpu],
    free_at: dict[int, datetime],
    submitted: datetime,
) -> int:
    """One job, submitted then (and a few minutes later); run on the GPUs that free first."""
    now = utcnow()
    user = rng.choices(list(MEMBERS), weights=list(MEMBERS.values()))[0]
    model, dataset = rng.choice(MODELS)
    gpu_count = rng.choices([1, 2, 4], weights=[6, 3, 1])[0]
    draw = rng.random()
    sweep = sweeps[0] if draw < 0.03 else sweeps[1] if draw < 0.05 else None
    if sweep is not None:
        user = sweep.user.name
    hyper = {
        "steps": rng.choice([2_000, 5_000, 10_000, 20_000]),
        "learning_rate": round(10 ** rng.uniform(-3.5, -0.7), 5),
        "batch_size": rng.choice([32, 64, 128]),
        "log_every": LOG_EVERY,
        "eval_every": 500,
    }
    flavour = f" lr={hyper['learning_rate']:.3g}" if sweep else rng.choice(["", "-baseline", "-wide", "-aug"])
    body = {
        "name": f"{model}-{dataset}{flavour}",
        "model": model,
        "dataset": dataset,
        "gpu_count": gpu_count,
        "hyperparameters": hyper,
        "priority": rng.choices(["normal", "high", "low"], [8, 1, 1])[0],
    }
    spec = JobSpec.model_validate(body)
    row = new_job(callers[user], spec, None, settings, None)
    submitted += timedelta(minutes=rng.uniform(0, 20))
    group = next(name for name, (_, members) in GROUPS.items() if user in members)
    job = Job(**{**row, "sweep_id": sweep.id if sweep else None, "created_at": submitted, "group": group})
    session.add(job)
    session.flush()
    if sweep is not None:
        sweep.spec = {
            **sweep.spec,
            "settings": [*sweep.spec["settings"], {"hyperparameters.learning_rate": hyper["learning_rate"]}],
        }
    # One host's GPUs, those that free first there, on the host where that is soonest.
    by_host = [
        sorted((g for g in gpus if g.host_id == host), key=lambda g: free_at[g.id])
        for host in {g.host_id for g in gpus}
    ]
    chosen = min((ranked[:gpu_count] for ranked in by_host), key=lambda some: max(free_at[g.id] for g in some))
    start = max(submitted, *(free_at[gpu.id] for gpu in chosen)) + timedelta(seconds=rng.uniform(2, 40))
    hours = rng.choice([rng.uniform(0.02, 0.3), rng.uniform(0.3, 3), rng.uniform(3, 10)])
    end = start + timedelta(hours=hours)
    event = _events(session, job, submitted)
    if start >= now:
        return _waiting(session, job, rng, now)
    fate = rng.choices(["succeeded", "failed", "cancelled"], weights=[80, 12, 8])[0]
    running = end > now
    stop = now if running else end
    if fate != "succeeded" and not running:
        stop = start + (end - start) * rng.uniform(0.05, 0.8)
    for gpu in chosen:
        free_at[gpu.id] = stop if not running else now + (end - now)
        session.add(Allocation(job_id=job.id, attempt=1, host_id=gpu.host_id, gpu_id=gpu.id, fraction=1.0,
                               created_at=start, released_at=None if running else stop))  # fmt: skip
    host = next(h for h in session.scalars(select(Host).where(Host.id == chosen[0].host_id)))
    job.host_name, job.started_at, job.towers = host.name, start, gpu_count
    job.cuda_visible_devices = ",".join(str(gpu.index) for gpu in chosen)
    event(JobState.DISPATCHED, start - timedelta(seconds=1), f"to {host.name}")
    event(JobState.RUNNING, start, f"pid {rng.randint(2000, 60000)} on {host.name}")
    done = (stop - start) / (end - start)
    _curves(session, job, rng, start, stop, int(job.total_steps * min(1.0, done)))
    if running:
        job.state = JobState.RUNNING
        return 1
    job.finished_at = stop
    if fate == "failed" and job.step:
        job.state, job.error, job.exit_code = JobState.FAILED, rng.choice(ERRORS).format(step=job.step), 1
        event(JobState.FAILED, stop, job.error.splitlines()[0])
    elif fate == "cancelled":
        job.state, job.stop_reason = JobState.CANCELLED, f"cancelled by {user}"
        event(JobState.CANCELLED, stop, job.stop_reason)
    else:
        job.state = JobState.SUCCEEDED
        event(JobState.SUCCEEDED, stop, None)
    return 1


def _events(session: Session, job: Job, submitted: datetime) -> Any:
    def add(state: JobState, time: datetime, message: str | None) -> None:
        session.add(JobEvent(job_id=job.id, time=time, state=state, attempt=1, message=message))

    add(JobState.QUEUED, submitted, "submitted")
    return add


def _waiting(session: Session, job: Job, rng: random.Random, now: datetime) -> int:
    job.created_at = min(job.created_at, now - timedelta(minutes=rng.uniform(1, 90)))
    session.execute(JobEvent.__table__.update().where(JobEvent.job_id == job.id).values(time=job.created_at))
    clock = (now + timedelta(minutes=rng.uniform(10, 300))).strftime("%H:%M")
    reason = rng.choice(WAITING).format(other=max(1, job.id - rng.randint(1, 30)), clock=clock, user=job.user.name,
                                        sweep=job.sweep_id or 1)  # fmt: skip
    job.pending_reason = reason
    job.queue_position = 1 + (session.query(Job).filter(Job.queue_position.is_not(None)).count())
    job.expected_start_at, job.expected_host = now + timedelta(minutes=rng.uniform(10, 300)), "lab-a"
    return 1


def _curves(session: Session, job: Job, rng: random.Random, start: datetime, stop: datetime, steps: int) -> None:
    """Train rows every LOG_EVERY steps and eval rows every 500: a loss that falls like a real
    one (fast, then slow, with noise), an accuracy that rises to a ceiling of its own."""
    if steps < LOG_EVERY:
        return
    ceiling, speed = rng.uniform(0.86, 0.995), rng.uniform(0.5, 3.0) / job.total_steps
    seconds = (stop - start).total_seconds() / steps
    rows: list[dict[str, Any]] = []
    for step in range(LOG_EVERY, steps + 1, LOG_EVERY):
        progress = 1 - math.exp(-speed * step * 4)
        loss = max(1e-4, 2.3 * (1 - progress) ** 1.5 + 0.05 * rng.random())
        accuracy = min(1.0, 0.1 + (ceiling - 0.1) * progress + 0.01 * rng.uniform(-1, 1))
        at = start + timedelta(seconds=seconds * step)
        rows.append(dict(job_id=job.id, attempt=1, step=step, split="train", loss=loss, accuracy=accuracy,
                         learning_rate=job.spec["hyperparameters"]["learning_rate"],
                         examples_per_sec=rng.uniform(3000, 9000), time=at))  # fmt: skip
        if step % 500 == 0:
            rows.append(dict(job_id=job.id, attempt=1, step=step, split="eval", loss=loss * 1.1,
                             accuracy=accuracy - 0.01, learning_rate=None, examples_per_sec=None, time=at))  # fmt: skip
    session.execute(Metric.__table__.insert(), rows)
    rollups.fold(session, rows)
    train = [r for r in rows if r["split"] == "train"]
    evals = [r for r in rows if r["split"] == "eval"]
    job.step, job.loss, job.accuracy = train[-1]["step"], train[-1]["loss"], train[-1]["accuracy"]
    job.examples_per_sec, job.step_time_s = train[-1]["examples_per_sec"], seconds
    if evals:
        job.eval_loss, job.eval_accuracy = evals[-1]["loss"], evals[-1]["accuracy"]


if __name__ == "__main__":
    sys.exit(main())
