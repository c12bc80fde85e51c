"""Registering this host and its GPUs in the database, and heartbeating."""

from __future__ import annotations

import logging
import os
import platform
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.lifecycle import runs_on
from service.core.models import HOLDING_STATES, Gpu, Host, HostState, Job, utcnow
from worker.inventory import GpuState, Inventory

log = logging.getLogger(__name__)


def register(session: Session, name: str, inventory: Inventory, info: dict[str, Any]) -> Host:
    """Create or update the host row and its GPUs (tracked by UUID); GPUs no longer seen are
    marked absent, not deleted, so their history stays."""
    host = session.scalars(select(Host).where(Host.name == name).with_for_update()).one_or_none()
    now = utcnow()
    if host is None:
        host = Host(name=name)
        session.add(host)
    host.state = HostState.UP
    host.simulated = inventory.simulated
    host.registered_at = now
    host.last_heartbeat_at = now
    host.info = info
    session.flush()
    states = inventory.gpus()
    seen = {g.uuid for g in states}
    known = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.host_id == host.id))}
    for gpu in known.values():
        if gpu.uuid not in seen:
            gpu.present = False
            gpu.index = -1 - gpu.id  # frees the index for the GPU now at it
    session.flush()
    for state in states:
        gpu = known.get(state.uuid) or Gpu(host_id=host.id, uuid=state.uuid, index=state.index)
        if gpu.id is None:
            session.add(gpu)
        _copy_state(gpu, state)
        gpu.present = True
    session.flush()
    return host


def heartbeat(
    session: Session, name: str, states: list[GpuState], attempts: list[tuple[int, int]], warm_trainers: int = 0
) -> bool:
    """Record that the host is alive, with fresh GPU numbers and how many warm trainers wait
    there (`info.warm_trainers`); False if it is not registered.

    `attempts` are the (job, attempt) pairs whose trainers this worker still supervises. A
    host that was marked down (its jobs went back to the queue) comes back up only once
    none of them is a lost attempt: a worker that was paused past the heartbeat timeout
    still has the old trainers, and their GPUs get no new work until they are gone."""
    host = session.scalars(select(Host).where(Host.name == name)).one_or_none()
    if host is None:
        return False
    host.last_heartbeat_at = utcnow()
    if (host.info or {}).get("warm_trainers") != warm_trainers:
        host.info = {**(host.info or {}), "warm_trainers": warm_trainers}
    if host.state != HostState.UP:
        lost = lost_attempts(session, name, attempts)
        if lost:
            log.warning("host %s is back but still runs lost attempts %s: it stays down until they end", name, lost)
        else:
            host.state = HostState.UP
    by_uuid = {g.uuid: g for g in session.scalars(select(Gpu).where(Gpu.host_id == host.id, Gpu.present.is_(True)))}
    for state in states:
        gpu = by_uuid.get(state.uuid)
        if gpu is not None:
            _copy_state(gpu, state)
    return True


def lost_attempts(session: Session, name: str, attempts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Those of `attempts` that are no longer their job's current attempt on this host."""
    if not attempts:
        return []
    current = {
        (row.id, row.attempts)
        for row in session.execute(
            select(Job.id, Job.attempts).where(
                Job.id.in_([job_id for job_id, _ in attempts]),
                runs_on(name),
                Job.state.in_(HOLDING_STATES),
            )
        )
    }
    return [attempt for attempt in attempts if attempt not in current]


def mark_down(session: Session, name: str) -> None:
    """The worker stops: no new jobs for this host until it registers again."""
    host = session.scalars(select(Host).where(Host.name == name)).one_or_none()
    if host is not None:
        host.state = HostState.DOWN


def _copy_state(gpu: Gpu, state: GpuState) -> None:
    gpu.index = state.index
    gpu.name = state.name
    gpu.memory_total_mb = state.memory_total_mb
    gpu.memory_used_mb = state.memory_used_mb
    gpu.utilization_pct = state.utilization_pct
    gpu.simulated = state.simulated
    gpu.processes = state.processes
    gpu.updated_at = utcnow()


def host_info(sandboxed: bool = True, job_disks: bool = False, no_notebooks: str | None = None) -> dict[str, Any]:
    """What the host's worker says of itself (`WorkerOut.info`): its sandbox, whether job
    folders are disk images of their limit or measured (`worker.disk`), why it runs no
    notebook sessions (`worker.notebook.why_no_sessions`; None: it runs them), its machine."""
    return {
        "sandbox": "bwrap" if sandboxed else "none",
        "job_disk": "image" if job_disks else "measure",
        "no_notebooks": no_notebooks,
        "pid": os.getpid(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
