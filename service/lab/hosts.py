"""Hosts and GPUs as the API shows them: inventory, who holds what, heartbeats, draining."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from service.core.db import Database
from service.core.models import HOLDING_STATES, Allocation, Host, Job, Reservation, User, utcnow
from service.core.schemas.lab import GpuHolder, GpuOut, GpuReservation, WorkerOut
from service.executors import Executor


class HostInventory:
    """The GPUs jobs can be placed on (host name -> present GPU indices), as the executor
    says (`Executor.capacity`), cached for a few seconds: submissions check against it
    without a query each."""

    def __init__(self, db: Database, executor: Executor, ttl_s: float = 2.0) -> None:
        self.db = db
        self.executor = executor
        self.ttl_s = ttl_s
        self._hosts: dict[str, list[int]] = {}
        self._smallest_mb: dict[str, int | None] = {}
        self._read_at = -math.inf
        self._lock = threading.Lock()

    def hosts(self, fresh: bool = False) -> dict[str, list[int]]:
        with self._lock:
            if fresh or time.monotonic() - self._read_at > self.ttl_s:
                self._read()
            return self._hosts

    def smallest_gpu_mb(self) -> dict[str, int | None]:
        """Per host, the memory of its smallest real GPU (None: simulated, no real limit)."""
        self.hosts()
        return self._smallest_mb

    def _read(self) -> None:
        with self.db.read() as session:
            capacity = self.executor.capacity(session)
        self._hosts = {name: list(host.gpus) for name, host in capacity.items()}
        self._smallest_mb = {name: host.smallest_gpu_mb for name, host in capacity.items()}
        self._read_at = time.monotonic()


def holders_by_gpu(session: Session) -> dict[int, list[GpuHolder]]:
    rows = session.execute(
        select(Allocation.gpu_id, Job.id, Job.name, User.name, Allocation.fraction)
        .join(Job, Allocation.job_id == Job.id)
        .join(User, Job.user_id == User.id)
        .where(Allocation.released_at.is_(None))
        .order_by(Job.id)
    )
    holders: dict[int, list[GpuHolder]] = defaultdict(list)
    for gpu_id, job_id, job_name, user, fraction in rows:
        holders[gpu_id].append(GpuHolder(job_id=job_id, job_name=job_name, user=user, fraction=fraction))
    return holders


def list_gpus(session: Session) -> list[GpuOut]:
    hosts = session.scalars(select(Host).options(selectinload(Host.gpus)).order_by(Host.name)).all()
    holders = holders_by_gpu(session)
    kept = reservations_by_gpu(session)
    out = []
    for host in hosts:
        for gpu in host.gpus:
            if not gpu.present:
                continue
            held = holders.get(gpu.id, [])
            out.append(
                GpuOut(
                    host=host.name,
                    index=gpu.index,
                    uuid=gpu.uuid,
                    name=gpu.name,
                    memory_total_mb=gpu.memory_total_mb,
                    memory_used_mb=gpu.memory_used_mb,
                    utilization_pct=gpu.utilization_pct,
                    simulated=gpu.simulated,
                    drained=gpu.drained,
                    host_state=host.state,
                    free_fraction=max(0.0, 1.0 - sum(h.fraction for h in held)),
                    holders=held,
                    processes=list(gpu.processes or []),
                    sandboxed=sandboxed(host),
                    no_notebooks=(host.info or {}).get("no_notebooks"),
                    reserved=kept.get((host.name, gpu.index)),
                )
            )
    return out


def reservations_by_gpu(session: Session) -> dict[tuple[str, int], GpuReservation]:
    """For each GPU a reservation keeps, the one in its window now, else the next to start."""
    now = utcnow()
    kept: dict[tuple[str, int], GpuReservation] = {}
    for reservation in session.scalars(
        select(Reservation).where(Reservation.end_at > now).order_by(Reservation.start_at, Reservation.id)
    ):
        said = GpuReservation(
            id=reservation.id,
            group=reservation.group,
            start_at=reservation.start_at,
            end_at=reservation.end_at,
            now=reservation.start_at <= now,
        )
        for host, index in reservation.gpus:
            kept.setdefault((str(host), int(index)), said)
    return kept


def sandboxed(host: Host) -> bool | None:
    """What the host's worker said of its trainers' sandbox at its last heartbeat."""
    said = (host.info or {}).get("sandbox")
    return None if said is None else said != "none"


def list_workers(session: Session) -> list[WorkerOut]:
    running = dict(
        session.execute(
            select(Job.host_name, func.count(Job.id)).where(Job.state.in_(HOLDING_STATES)).group_by(Job.host_name)
        ).all()
    )
    now = utcnow()
    return [
        WorkerOut(
            name=host.name,
            state=host.state,
            simulated=host.simulated,
            gpus=sum(1 for g in host.gpus if g.present),
            last_heartbeat_at=host.last_heartbeat_at,
            heartbeat_age_s=round((now - host.last_heartbeat_at).total_seconds(), 3),
            registered_at=host.registered_at,
            running_jobs=running.get(host.name, 0),
            info=host.info,
            sandboxed=sandboxed(host),
            job_disk=(host.info or {}).get("job_disk"),
            no_notebooks=(host.info or {}).get("no_notebooks"),
        )
        for host in session.scalars(select(Host).options(selectinload(Host.gpus)).order_by(Host.name))
    ]
