"""Repairing what a crash or a Redis wipe left behind, from the database's point of view.

- A host whose heartbeat stopped is marked down; its jobs go back to the queue (their
  next attempt), fenced so the lost attempt can write nothing if it still runs somewhere.
  A job over several hosts goes back when any of its hosts is lost: its other ranks see
  the attempt has moved on and stop.
- A dispatched job whose launch message vanished (Redis flushed or restarted) has it
  sent again, rank by rank for a job over several hosts; one that no worker picked up for
  three dispatch timeouts is requeued.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.lifecycle import requeue, runs_on
from service.core.models import HOLDING_STATES, Allocation, Host, HostState, Job, JobState
from service.core.settings import Settings
from service.executors import Attempt, Executor

log = logging.getLogger(__name__)


@dataclass
class Repairs:
    hosts_down: list[str] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    resend: list[tuple[int, int, str, int]] = field(default_factory=list)
    """(job id, attempt, host, rank) whose launch message must be sent again."""


def needs_repair(session: Session, settings: Settings, now: datetime) -> bool:
    """Whether a host missed its heartbeats or a dispatch is overdue (a cheap read)."""
    heartbeat_cutoff = now - timedelta(seconds=settings.heartbeat_timeout_s)
    dispatch_cutoff = now - timedelta(seconds=settings.dispatch_timeout_s)
    dead = select(Host.id).where(Host.state == HostState.UP, Host.last_heartbeat_at < heartbeat_cutoff)
    late = (
        select(Allocation.id)
        .join(Job, (Allocation.job_id == Job.id) & (Allocation.attempt == Job.attempts))
        .where(
            Job.state == JobState.DISPATCHED, Allocation.released_at.is_(None), Allocation.created_at < dispatch_cutoff
        )
    )
    return session.execute(select(dead.exists() | late.exists())).scalar_one()


def mark_dead_hosts(session: Session, settings: Settings, now: datetime, repairs: Repairs) -> None:
    cutoff = now - timedelta(seconds=settings.heartbeat_timeout_s)
    dead = session.scalars(select(Host).where(Host.state == HostState.UP, Host.last_heartbeat_at < cutoff)).all()
    for host in dead:
        host.state = HostState.DOWN
        repairs.hosts_down.append(host.name)
        log.warning("host %s missed heartbeats since %s: marked down", host.name, host.last_heartbeat_at)
        jobs = session.scalars(
            select(Job).where(runs_on(host.name), Job.state.in_(HOLDING_STATES)).with_for_update()
        ).all()
        for job in jobs:
            requeue(session, job, f"host {host.name} stopped sending heartbeats", crashed=True)
            repairs.requeued.append(job.id)


def resend_lost_launches(
    session: Session, settings: Settings, executor: Executor, now: datetime, repairs: Repairs
) -> None:
    timeout = timedelta(seconds=settings.dispatch_timeout_s)
    rows = session.execute(
        select(Job, Allocation.created_at, Host.name)
        .join(Allocation, (Allocation.job_id == Job.id) & (Allocation.attempt == Job.attempts))
        .join(Host, Host.id == Allocation.host_id)
        .where(Job.state == JobState.DISPATCHED, Allocation.released_at.is_(None))
        .order_by(Job.id, Allocation.id)
    ).all()
    hosts: dict[int, list[str]] = {}  # by rank: the order the pass gave them (as the workers read it)
    jobs: dict[int, tuple[Job, datetime]] = {}
    for job, dispatched_at, host in rows:
        jobs.setdefault(job.id, (job, dispatched_at))
        if host not in hosts.setdefault(job.id, []):
            hosts[job.id].append(host)
    for job_id, (job, dispatched_at) in jobs.items():
        if now - dispatched_at < timeout:
            continue
        if now - dispatched_at > 3 * timeout:
            where = ", ".join(hosts[job_id]) or job.host_name
            requeue(session, job, f"no worker on {where} started it within {3 * timeout.seconds}s", crashed=True)
            repairs.requeued.append(job_id)
            continue
        for rank, host in enumerate(hosts[job_id]):
            if not executor.observe(Attempt(job_id, job.attempts, host, rank=rank)).held:
                repairs.resend.append((job_id, job.attempts, host, rank))
