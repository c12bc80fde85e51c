"""Reservations: GPUs an admin keeps for a group over a window (a deadline, a demo).

The GPUs are chosen when the reservation is made, on as few hosts as hold them (so a gang
job of the group fits), free of any other reservation overlapping the window, preferring
GPUs no job holds now. From the window's start only the group's jobs take them; before
it, another job takes one only if its time limit ends it in time (with preemption on, also
one very likely to end in time: it is stopped at the start if it has not). The scheduling
policy does the keeping (`service.scheduler.capacity.FreeGpus`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.exceptions import NotFoundError, SpecError
from service.core.models import Allocation, Gpu, Group, Host, HostState, Job, Reservation

MAX_WINDOW = timedelta(days=90)


@dataclass
class Holder:
    """A job on a chosen GPU that may still run when the window starts."""

    job_id: int
    host: str
    gpu: int
    ends_at: datetime | None
    """Its time limit's end; None: it has none."""


def create_reservation(
    session: Session,
    group: str,
    count: int,
    start: datetime,
    end: datetime,
    now: datetime,
    by: str,
    host: str | None = None,
    note: str = "",
) -> tuple[Reservation, list[Holder]]:
    """Keep `count` GPUs (of `host`, if given) for `group` from `start` to `end`; with the
    jobs that hold a chosen GPU and may run past `start`. SpecError, naming the field, for a
    window or a count that cannot be honoured."""
    if session.scalars(select(Group.id).where(Group.name == group)).first() is None:
        raise SpecError("group", f"there is no group {group!r} (towerq group list shows them)")
    start = max(start, now)
    if end <= start:
        raise SpecError("end", "the window must end after it starts, and after now")
    if end - start > MAX_WINDOW:
        raise SpecError("end", f"a reservation may last at most {MAX_WINDOW.days} days")
    usable = _usable_gpus(session, host)
    if not usable:
        where = f"host {host!r} has" if host is not None else "the lab has"
        raise SpecError("host" if host is not None else "gpus", f"{where} no GPU that is up and not drained")
    if count > len(usable):
        where = f"host {host} has" if host is not None else "the lab has"
        raise SpecError("gpus", f"{count} GPUs cannot be kept: {where} {len(usable)} that are up and not drained")
    kept = _kept_over(session, start, end)
    free = [gpu for gpu in usable if gpu not in kept]
    if count > len(free):
        others = sorted({kept[gpu] for gpu in usable if gpu in kept})
        raise SpecError(
            "gpus",
            f"only {len(free)} GPUs are not kept by other reservations over that window "
            f"({', '.join(f'reservation {i}' for i in others)})",
        )
    busy = _holders(session)
    chosen = _choose(free, busy, count)
    row = Reservation(
        group=group, gpus=[[h, i] for h, i in chosen], start_at=start, end_at=end, note=note, created_by=by
    )
    session.add(row)
    session.flush()
    holders = [
        Holder(job_id, h, i, ends_at)
        for (h, i) in chosen
        for job_id, ends_at, job_group in busy.get((h, i), [])
        if job_group != group and (ends_at is None or ends_at > start)
    ]
    return row, holders


def _usable_gpus(session: Session, host: str | None) -> list[tuple[str, int]]:
    query = (
        select(Host.name, Gpu.index)
        .join(Gpu, Gpu.host_id == Host.id)
        .where(Host.state == HostState.UP, Gpu.present.is_(True), Gpu.drained.is_(False))
        .order_by(Host.name, Gpu.index)
    )
    if host is not None:
        query = query.where(Host.name == host)
    return [(name, index) for name, index in session.execute(query)]


def _kept_over(session: Session, start: datetime, end: datetime) -> dict[tuple[str, int], int]:
    """The GPUs other reservations keep during any of [start, end), with their ids."""
    rows = session.scalars(select(Reservation).where(Reservation.start_at < end, Reservation.end_at > start))
    return {(h, int(i)): r.id for r in rows for h, i in r.gpus}


def _holders(session: Session) -> dict[tuple[str, int], list[tuple[int, datetime | None, str | None]]]:
    """Each GPU's running jobs: (id, when their time limit ends them, group)."""
    rows = session.execute(
        select(Host.name, Gpu.index, Job.id, Allocation.created_at, Job.time_limit_s, Job.group)
        .join(Gpu, Allocation.gpu_id == Gpu.id)
        .join(Host, Allocation.host_id == Host.id)
        .join(Job, Allocation.job_id == Job.id)
        .where(Allocation.released_at.is_(None))
    )
    held: dict[tuple[str, int], list[tuple[int, datetime | None, str | None]]] = defaultdict(list)
    for host, index, job_id, started, limit_s, group in rows:
        ends = started + timedelta(seconds=limit_s) if limit_s is not None else None
        held[(host, index)].append((job_id, ends, group))
    return held


def _choose(
    free: list[tuple[str, int]], busy: dict[tuple[str, int], list[tuple[int, datetime | None, str | None]]], count: int
) -> list[tuple[str, int]]:
    """`count` of `free` on as few hosts as hold them (the hosts with the most first), the
    GPUs no job holds now first on each."""
    by_host: dict[str, list[int]] = defaultdict(list)
    for host, index in free:
        by_host[host].append(index)
    chosen: list[tuple[str, int]] = []
    for host in sorted(by_host, key=lambda h: (-len(by_host[h]), h)):
        indices = sorted(by_host[host], key=lambda i: (bool(busy.get((host, i))), i))
        chosen += [(host, i) for i in indices[: count - len(chosen)]]
        if len(chosen) == count:
            break
    return sorted(chosen)


def reservations(session: Session, now: datetime, include_past: bool = False) -> list[Reservation]:
    query = select(Reservation).order_by(Reservation.start_at, Reservation.id)
    if not include_past:
        query = query.where(Reservation.end_at > now)
    return list(session.scalars(query).all())


def delete_reservation(session: Session, reservation_id: int) -> Reservation:
    row = session.get(Reservation, reservation_id)
    if row is None:
        raise NotFoundError(f"no reservation {reservation_id}")
    session.delete(row)
    return row


def open_reservations(session: Session, group: str, now: datetime) -> list[int]:
    """The reservations of `group` not yet over."""
    query = select(Reservation.id).where(Reservation.group == group, Reservation.end_at > now)
    return list(session.scalars(query).all())
