"""Sweeps: launch a grid or random search of one job spec, follow it, cancel it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from service.api.deps import CallerDep, DatabaseDep, ExecutorDep, InventoryDep, SessionDep, SettingsDep
from service.core import results
from service.core.models import Job, Sweep, SweepRung
from service.core.schemas.sweeps import RungOut, SweepJob, SweepList, SweepOut
from service.jobs import sweeps

router = APIRouter(prefix="/api/sweeps", tags=["sweeps"])
SweepId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def describe(session: Session, sweep: Sweep, with_jobs: bool = True) -> SweepOut:
    jobs = list(session.scalars(select(Job).where(Job.sweep_id == sweep.id).order_by(Job.id)))
    metric, goal = sweep.spec["metric"], sweep.spec["goal"]
    settings = sweep.spec.get("settings", [])
    counts = results.counts_by_state(jobs)
    listed = [
        SweepJob(
            id=job.id,
            name=job.name,
            state=job.state,
            setting=settings[i] if i < len(settings) else {},
            result=results.result_of(job, metric),
            step=job.step,
            total_steps=job.total_steps,
        )
        for i, job in enumerate(jobs)
    ]
    return SweepOut(
        id=sweep.id,
        name=sweep.name,
        user=sweep.user.name,
        created_at=sweep.created_at,
        metric=metric,
        goal=goal,
        max_parallel=sweep.spec.get("max_parallel"),
        fields=list(settings[0]) if settings else [],
        counts=counts,
        done=sum(counts.get(state, 0) for state in sweeps.FINAL),
        total=len(jobs),
        best_job=results.best_job(jobs, metric, goal),
        metric_missing=results.metric_missing(jobs, metric),
        jobs=listed if with_jobs else [],
        early_stopping=sweep.spec.get("early_stopping"),
        rungs=rungs_of(session, sweep.id) if with_jobs and sweep.spec.get("early_stopping") else [],
    )


def rungs_of(session: Session, sweep_id: int) -> list[RungOut]:
    rows = session.scalars(
        select(SweepRung).where(SweepRung.sweep_id == sweep_id).order_by(SweepRung.reached_at, SweepRung.rung)
    )
    return [
        RungOut(job_id=r.job_id, rung=r.rung + 1, step=r.step, value=r.value, stopped=r.stopped, cut=r.cut)
        for r in rows
    ]


@router.post("", status_code=201, response_model=SweepOut)
def create(
    body: sweeps.SweepIn,
    caller: CallerDep,
    db: DatabaseDep,
    settings: SettingsDep,
    inventory: InventoryDep,
) -> SweepOut:
    """Every setting becomes a job spec, checked like a submission before anything is
    stored; then the sweep and its jobs (queued) are stored, in one transaction."""
    sweep_id = sweeps.create_sweep(db, caller, body, settings, inventory)
    with db.read() as session:
        return describe(session, sweeps.get_sweep(session, sweep_id))


@router.get("", response_model=SweepList)
def listing(session: SessionDep, _: CallerDep) -> SweepList:
    """Every sweep, newest first, with its progress and best job (not its jobs)."""
    rows = session.scalars(select(Sweep).options(joinedload(Sweep.user)).order_by(Sweep.id.desc()).limit(200))
    return SweepList(items=[describe(session, sweep, with_jobs=False) for sweep in rows])


@router.get("/{sweep_id}", response_model=SweepOut)
def show(sweep_id: SweepId, session: SessionDep, _: CallerDep) -> SweepOut:
    """The sweep: its jobs with their settings, states and results; progress; the best job."""
    return describe(session, sweeps.get_sweep(session, sweep_id))


@router.post("/{sweep_id}/cancel", response_model=SweepOut)
def cancel(sweep_id: SweepId, db: DatabaseDep, caller: CallerDep, executor: ExecutorDep) -> SweepOut:
    """Cancel every unfinished job of the sweep (its owner or an admin)."""
    sweeps.cancel_sweep(db, caller, sweep_id, executor)
    with db.read() as session:
        return describe(session, sweeps.get_sweep(session, sweep_id))
