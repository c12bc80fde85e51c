"""GPUs: the inventory of every host, who holds what, and draining."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service.api.deps import AdminDep, CallerDep, DatabaseDep, SessionDep
from service.core.db import Database
from service.core.exceptions import NotFoundError
from service.core.gpus import set_drained
from service.core.schemas.lab import GpuOut
from service.lab.hosts import list_gpus

router = APIRouter(prefix="/api/gpus", tags=["gpus"])

HostName = Annotated[str, Path(min_length=1, max_length=128)]
Index = Annotated[int, Path(ge=0, le=1023)]


@router.get("", response_model=list[GpuOut])
def gpus(session: SessionDep, _: CallerDep) -> list[GpuOut]:
    """Every GPU: host, index, model, memory, utilization, who holds it."""
    return list_gpus(session)


@router.post("/{host}/{index}/drain", response_model=list[GpuOut])
def drain(host: HostName, index: Index, db: DatabaseDep, _: AdminDep) -> list[GpuOut]:
    """Drain a GPU: its jobs finish, it takes no new ones (admins)."""
    return _set_drained(db, host, index, True)


@router.post("/{host}/{index}/undrain", response_model=list[GpuOut])
def undrain(host: HostName, index: Index, db: DatabaseDep, _: AdminDep) -> list[GpuOut]:
    """Give a drained GPU back to the scheduler (admins)."""
    return _set_drained(db, host, index, False)


def _set_drained(db: Database, host: str, index: int, drained: bool) -> list[GpuOut]:
    with db.write() as session:
        if not set_drained(session, host, [index], drained):
            raise NotFoundError(f"no GPU {index} on host {host}")
        session.flush()
        return [g for g in list_gpus(session) if g.host == host]
