"""Liveness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from sqlalchemy import func, select, text

from service.api.deps import CallerDep, ContextDep, SessionDep
from service.models import Allocation, Gpu, Host, HostState, Job, JobState

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(ctx: ContextDep) -> dict[str, str]:
    """Liveness: the API answers; the database and Redis are reported, not required."""
    status = {"status": "ok", "database": "ok", "redis": "ok"}
    try:
        with ctx.db.read() as session:
            session.execute(text("SELECT 1"))
    except Exception as err:  # noqa: BLE001 - reported, not raised: liveness must answer
        status["database"] = f"error: {type(err).__name__}"
    try:
        ctx.redis.ping()
    except Exception as err:  # noqa: BLE001
        status["redis"] = f"error: {type(err).__name__}"
    if status["database"] != "ok" or status["redis"] != "ok":
        status["status"] = "degraded"
    return status


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(session: SessionDep, _: CallerDep) -> str:
    """Prometheus text: jobs by state, GPUs, hosts, queue length."""
    lines = ["# HELP towerq_jobs Jobs by state.", "# TYPE towerq_jobs gauge"]
    counts = dict(session.execute(select(Job.state, func.count(Job.id)).group_by(Job.state)).all())
    for state in JobState:
        lines.append(f'towerq_jobs{{state="{state}"}} {counts.get(state, 0)}')
    hosts = dict(session.execute(select(Host.state, func.count(Host.id)).group_by(Host.state)).all())
    lines += ["# HELP towerq_hosts GPU hosts by state.", "# TYPE towerq_hosts gauge"]
    for host_state in HostState:
        lines.append(f'towerq_hosts{{state="{host_state}"}} {hosts.get(host_state, 0)}')
    total = session.scalar(select(func.count(Gpu.id)).where(Gpu.present.is_(True))) or 0
    held = session.scalar(
        select(func.coalesce(func.sum(Allocation.fraction), 0.0)).where(Allocation.released_at.is_(None))
    )
    lines += [
        "# HELP towerq_gpus GPUs registered.",
        "# TYPE towerq_gpus gauge",
        f"towerq_gpus {total}",
        "# HELP towerq_gpus_allocated GPUs allocated (fractions summed).",
        "# TYPE towerq_gpus_allocated gauge",
        f"towerq_gpus_allocated {float(held or 0):g}",
    ]
    return "\n".join(lines) + "\n"
