"""Workers: the GPU hosts, their heartbeats and state."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import CallerDep, SessionDep
from service.hosts import list_workers
from service.schemas import WorkerOut

router = APIRouter(prefix="/api/workers", tags=["workers"])


@router.get("", response_model=list[WorkerOut])
def workers(session: SessionDep, _: CallerDep) -> list[WorkerOut]:
    """Hosts, last heartbeat, state, running jobs."""
    return list_workers(session)
