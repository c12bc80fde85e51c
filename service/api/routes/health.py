"""Liveness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import text

from service.api.deps import CallerDep, ContextDep
from service.notifications.prometheus import TowerqCollector

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
def prometheus(ctx: ContextDep, _: CallerDep) -> Response:
    """Prometheus text (service/notifications/prometheus.py): jobs by state and user, queue length, GPUs by
    host and state, utilization, queue-wait, submit-to-running and pass-time histograms."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TowerqCollector(ctx.db, ctx.redis))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
