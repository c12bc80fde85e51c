"""Workers: the GPU hosts, their heartbeats and state."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import CallerDep, SessionDep
from service.core.schemas.lab import WorkerOut
from service.lab.hosts import list_workers

router = APIRouter(prefix="/api/workers", tags=["workers"])


@router.get("", response_model=list[WorkerOut])
def workers(session: SessionDep, _: CallerDep) -> list[WorkerOut]:
    """Hosts, last heartbeat, state, running jobs."""
    return list_workers(session)
