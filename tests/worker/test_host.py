"""A host marked down comes back up only once it no longer runs a lost attempt."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from service.core.context import Context
from service.core.db import Database
from service.core.models import Host, HostState, Job, User
from service.core.settings import Settings
from worker.agent import HostAgent
from worker.host import heartbeat
from worker.inventory import SimulatedInventory


def host_state(db: Database) -> str:
    with db.read() as session:
        return session.scalars(select(Host.state).where(Host.name == "lab-a")).one()


def test_a_returning_host_stays_down_while_it_runs_a_lost_attempt(
    db: Database, add_host: Callable[..., None], make_token: Callable[..., str]
) -> None:
    add_host("lab-a", 2)
    make_token("alice")
    with db.write() as session:
        user_id = session.scalars(select(User.id).where(User.name == "alice")).one()
        job = Job(name="j", user_id=user_id, state="running", spec={}, priority="normal", gpu_count=1)
        job.gpu_memory_fraction, job.total_steps, job.max_attempts = 1.0, 10, 3
        job.attempts, job.crashes, job.host_name = 2, 1, "lab-a"  # attempt 1 was lost with the host
        session.add(job)
        session.scalars(select(Host).where(Host.name == "lab-a")).one().state = HostState.DOWN
    with db.read() as session:
        job_id = session.scalars(select(Job.id)).one()
    states = SimulatedInventory("lab-a", 2).gpus()

    with db.write() as session:
        assert heartbeat(session, "lab-a", states, [(job_id, 1)])
    assert host_state(db) == HostState.DOWN, "its old trainer may still hold a GPU"

    with db.write() as session:
        assert heartbeat(session, "lab-a", states, [(job_id, 2)])  # the current attempt is fine
    assert host_state(db) == HostState.UP


def test_a_stopped_worker_has_ended_its_loops_before_its_context_closes(settings: Settings) -> None:
    """A heartbeat or control loop still in Redis's connection pool when the process exits
    holds the pool's lock, frozen, and the client's close at exit then waits forever: the
    worker outlived SIGTERM until its supervisor killed it, a minute later."""
    ctx = Context.open(settings.model_copy(update={"trainer_pool": 0, "sandbox": "none"}))
    agent = HostAgent(ctx, "lab-a", SimulatedInventory("lab-a", 1))
    try:
        agent.start()
        assert [loop.name for loop in agent.loops] == ["lab-a-heartbeat", "lab-a-control"]
        assert all(loop.is_alive() for loop in agent.loops)
        agent.shutdown()
        assert not any(loop.is_alive() for loop in agent.loops)
    finally:
        ctx.close()
