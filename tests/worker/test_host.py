"""A host marked down comes back up only once it no longer runs a lost attempt; a restarted
worker sends back the jobs it ran, a rank of a job over several hosts included."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import func, select

from service.core.context import Context
from service.core.db import Database
from service.core.lifecycle import finish, mark_running
from service.core.models import Allocation, Host, HostState, Job, JobState, User
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from towerq.contract.spec import JobSpec
from worker import disk_kind, reaper
from worker.agent import HostAgent
from worker.host import heartbeat
from worker.inventory import SimulatedInventory
from worker.launch import read_launch
from worker.runner import JobRunner


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
        sweeps = ["lab-a-disks"] if disk_kind.in_use(ctx.settings) else []  # job folders on disk images (a root worker)
        # and the build of queued jobs' requirements (worker.prepare)
        assert [loop.name for loop in agent.loops] == ["lab-a-heartbeat", "lab-a-control", *sweeps, "lab-a-envs"]
        assert all(loop.is_alive() for loop in agent.loops)
        agent.shutdown()
        assert not any(loop.is_alive() for loop in agent.loops)
    finally:
        ctx.close()


def test_a_heartbeat_under_way_when_the_worker_shuts_down_does_not_mark_the_host_up_again(
    settings: Settings, db: Database
) -> None:
    """The heartbeat here has passed its check of `stopping` and waits for the agent's lock
    (as a heartbeat waits for the database on a busy host) while the worker shuts down: the
    host must end down, or the scheduler sends the jobs the shutdown requeued back to it."""
    ctx = Context.open(settings.model_copy(update={"trainer_pool": 0, "sandbox": "none", "heartbeat_interval_s": 0.1}))
    agent = HostAgent(ctx, "lab-a", SimulatedInventory("lab-a", 1))
    try:
        agent.start()
        with agent.lock:
            time.sleep(0.5)  # the heartbeat loop is at the lock by now
            stopping = threading.Thread(target=agent.shutdown)
            stopping.start()
            time.sleep(0.5)
        stopping.join(30)
        assert not stopping.is_alive()
        with db.read() as session:
            assert session.scalar(select(Host.state).where(Host.name == "lab-a")) == HostState.DOWN
    finally:
        ctx.close()


def two_host_job(settings: Settings) -> tuple[int, str, str]:
    """A running 4-GPU job over lab-a and lab-b (2 GPUs each): (its id, rank 0's host, rank 1's)."""
    ctx = Context.open(settings)
    try:
        with ctx.db.write() as session:
            user = ensure_user(session, "alice")
            alice = Caller(user.id, user.name, False, 0)
        spec = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "gpu_count": 4})
        job, _ = submit(ctx.db, alice, spec, settings)
        LiveScheduler(ctx).run_pass()
        with ctx.db.write() as session:
            chief = mark_running(session, job.id, 1, {"pid": 1}).host_name
    finally:
        ctx.close()
    assert chief is not None
    return job.id, chief, "lab-b" if chief == "lab-a" else "lab-a"


def test_a_returning_host_that_runs_rank_1_of_a_job_over_two_hosts_comes_back_up(
    db: Database, settings: Settings, add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    add_host("lab-b", 2)
    job_id, _, other = two_host_job(settings)
    with db.write() as session:
        session.scalars(select(Host).where(Host.name == other)).one().state = HostState.DOWN
        assert heartbeat(session, other, SimulatedInventory(other, 2).gpus(), [(job_id, 1)])
    with db.read() as session:
        assert session.scalars(select(Host.state).where(Host.name == other)).one() == HostState.UP


def test_a_restarted_worker_sends_back_a_job_over_two_hosts_whose_rank_it_ran(
    db: Database, settings: Settings, add_host: Callable[..., None]
) -> None:
    """Its trainer died with the old worker; the rank on the other host would otherwise wait
    for it until the cluster's start timeout."""
    add_host("lab-a", 2)
    add_host("lab-b", 2)
    job_id, _, other = two_host_job(settings)
    ctx = Context.open(settings.model_copy(update={"trainer_pool": 0, "sandbox": "none"}))
    try:
        HostAgent(ctx, other, SimulatedInventory(other, 2))._recover_leftovers()
    finally:
        ctx.close()
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and (job.state, job.attempts, job.crashes) == (JobState.QUEUED, 2, 1)
        assert session.scalar(select(func.count()).where(Allocation.released_at.is_(None))) == 0


def test_a_new_attempt_waits_for_a_runner_whose_gpus_were_released_but_not_for_one_sharing_them(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    """A job over several hosts releases every host's GPUs when one rank records its end,
    while the job's rank here may take a moment more to stop: a job given those GPUs starts
    once it is gone. A job sharing the GPUs by memory fraction still holds them: no wait."""
    add_host("lab-a", 2)
    ctx = Context.open(settings.model_copy(update={"trainer_pool": 0, "sandbox": "none"}))
    try:
        with ctx.db.write() as session:
            user = ensure_user(session, "alice")
            alice = Caller(user.id, user.name, False, 0)
        ids = []
        for _ in range(3):
            spec = JobSpec.model_validate(
                {"model": "mlp", "dataset": "digits", "gpus": [0], "host": "lab-a", "gpu_memory_fraction": 0.3}
            )
            ids.append(submit(ctx.db, alice, spec, settings)[0].id)
        LiveScheduler(ctx).run_pass()
        ending, sharing, new = (
            JobRunner(ctx, SimulatedInventory("lab-a", 2), read_launch(ctx, i, 1, "lab-a"), lambda _: None) for i in ids
        )
        with ctx.db.write() as session:
            finish(session, ids[0], 1, JobState.CANCELLED)  # recorded elsewhere: its GPUs are released
        ends, shares = threading.Event(), threading.Event()
        ending.thread = threading.Thread(target=ends.wait, daemon=True)
        sharing.thread = threading.Thread(target=shares.wait, daemon=True)
        ending.thread.start()
        sharing.thread.start()
        new.after = [ending, sharing]
        waiter = threading.Thread(target=new._wait_for_earlier)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive(), "it must wait for the runner still ending on its GPU"
        ends.set()  # that one ends; the one sharing the GPU still runs
        waiter.join(5.0)
        assert not waiter.is_alive() and sharing.thread.is_alive()
        shares.set()
        said = [line["message"] for line in new.sink.logs]
        assert said == [f"waiting for job {ids[0]} to leave GPUs [0] on this host first"], said
    finally:
        ctx.close()


def test_a_new_attempt_kills_the_trainer_of_an_earlier_runner_that_is_stuck_and_logs_where(
    settings: Settings, add_host: Callable[..., None], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The hand-over must not depend on the earlier runner ending on time (a clean-clone run
    once saw an old rank alive while the next attempt ran): once the wait is up, the new
    runner kills the old trainer itself, waits until it is gone, and logs where the stuck
    runner was, so the next time says why."""
    monkeypatch.setattr(reaper, "ZOMBIE_WAIT_S", 0.0)
    add_host("lab-a", 2)
    ctx = Context.open(settings.model_copy(update={"trainer_pool": 0, "sandbox": "none", "cancel_grace_s": 0.0}))
    old: subprocess.Popen[bytes] | None = None
    try:
        with ctx.db.write() as session:
            user = ensure_user(session, "alice")
            alice = Caller(user.id, user.name, False, 0)
        ids = []
        for gpu in range(2):  # (on a real hand-over the GPUs are the same: `after` is set below)
            spec = JobSpec.model_validate({"model": "mlp", "dataset": "digits", "gpus": [gpu], "host": "lab-a"})
            ids.append(submit(ctx.db, alice, spec, settings)[0].id)
        LiveScheduler(ctx).run_pass()
        stuck, new = (
            JobRunner(ctx, SimulatedInventory("lab-a", 2), read_launch(ctx, i, 1, "lab-a"), lambda _: None) for i in ids
        )
        old = subprocess.Popen(["sleep", "600"], start_new_session=True)
        stuck.process, stuck.trainer_pids = old, {old.pid}
        with ctx.db.write() as session:
            finish(session, ids[0], 1, JobState.CANCELLED)  # its GPU is released; its runner hangs
        never = threading.Event()
        stuck.thread = threading.Thread(target=never.wait, name="stuck-runner", daemon=True)
        stuck.thread.start()
        new.after = [stuck]
        began = time.monotonic()
        with caplog.at_level(logging.INFO, logger="worker.reaper"):
            new._wait_for_earlier()
        assert old.poll() is not None, "the stuck runner's trainer is gone before the new attempt goes on"
        assert 9 < time.monotonic() - began < 40
        said = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
        assert f"job {ids[0]} attempt 1 did not end; killing its trainer" in said
        assert "threading.py" in said and "in wait" in said, said  # its stack: waiting on the event
        never.set()
    finally:
        if old is not None and old.poll() is None:
            old.kill()
            old.wait()
        ctx.close()
