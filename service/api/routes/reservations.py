"""Reservations: admins keep GPUs for a group over a window; everyone reads them (a wait
they cause names them)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import AfterValidator, AwareDatetime, BaseModel, Field

from service.api.deps import AdminDep, CallerDep, DatabaseDep, SessionDep
from service.core.models import Reservation, utcnow
from service.core.schemas.lab import HolderOut, KeptGpu, NewReservation, ReservationOut
from service.lab import reservations as lab_reservations
from towerq.contract.spec import GROUP_NAME_PATTERN
from towerq.contract.times import in_utc

router = APIRouter(prefix="/api", tags=["reservations"])

ReservationId = Annotated[int, Path(ge=1, le=2**31 - 1)]


class ReservationCreate(BaseModel):
    model_config = {"extra": "forbid"}

    group: str = Field(pattern=GROUP_NAME_PATTERN)
    gpus: int = Field(ge=1, le=100_000, description="how many GPUs to keep")
    start: Annotated[AwareDatetime, AfterValidator(in_utc)] = Field(
        description="ISO 8601 with a time zone; a time past means now"
    )
    end: Annotated[AwareDatetime, AfterValidator(in_utc)]
    host: str | None = Field(default=None, min_length=1, max_length=128, description="keep GPUs of this host only")
    note: str = Field(default="", max_length=200, description="what it is for (a deadline, a demo)")


def reservation_out(row: Reservation, now: datetime) -> ReservationOut:
    return ReservationOut(
        id=row.id,
        group=row.group,
        gpus=[KeptGpu(host=h, index=i) for h, i in row.gpus],
        start_at=row.start_at,
        end_at=row.end_at,
        active=row.start_at <= now < row.end_at,
        note=row.note,
        created_by=row.created_by,
        created_at=row.created_at,
    )


@router.get("/reservations", response_model=list[ReservationOut])
def reservations(
    session: SessionDep,
    _: CallerDep,
    all: Annotated[bool, Query(description="those already over too")] = False,  # noqa: A002
) -> list[ReservationOut]:
    """The lab's reservations not yet over (with `all`, every one), soonest first."""
    now = utcnow()
    return [reservation_out(row, now) for row in lab_reservations.reservations(session, now, all)]


@router.post("/reservations", status_code=201, response_model=NewReservation)
def create_reservation(body: ReservationCreate, db: DatabaseDep, admin: AdminDep) -> NewReservation:
    """Keep GPUs for a group over a window (admins). Refused, naming the field, when the
    lab cannot honour it: more GPUs than it has, or than other reservations leave."""
    now = utcnow()
    with db.write() as session:
        row, holders = lab_reservations.create_reservation(
            session, body.group, body.gpus, body.start, body.end, now, admin.name, body.host, body.note
        )
        out = reservation_out(row, now)
    held = [HolderOut(job_id=h.job_id, host=h.host, gpu=h.gpu, ends_at=h.ends_at) for h in holders]
    return NewReservation(**out.model_dump(), held_past_start=held)


@router.delete("/reservations/{reservation_id}", response_model=ReservationOut)
def delete_reservation(reservation_id: ReservationId, db: DatabaseDep, _: AdminDep) -> ReservationOut:
    """End a reservation now, or take back one not begun (admins)."""
    with db.write() as session:
        return reservation_out(lab_reservations.delete_reservation(session, reservation_id), utcnow())
