"""The live pass against a real database and Redis (SQLite and PostgreSQL)."""

from __future__ import annotations

import gc
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from service.cli.scheduling import forecast_between_passes, serve
from service.core import defaults, keys, launches
from service.core.context import Context
from service.core.exceptions import SpecError
from service.core.lifecycle import finish, locked_job, mark_running, requeue
from service.core.models import Allocation, Gpu, Host, HostState, Job, JobState, User, utcnow
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller
from service.scheduler.costs import CHECKPOINT_S
from service.scheduler.dryrun import estimate
from service.scheduler.live import LiveScheduler, PassReport
from service.scheduler.snapshot import read_cluster, read_queued
from tests.stack import wait_for
from towerq.contract.spec import JobSpec


def submit_job(ctx: Context, who: Caller, **spec: object) -> int:
    body = {"model": "mlp", "dataset": "digits", **spec}
    job, _ = submit(ctx.db, who, JobSpec.model_validate(body), ctx.settings)
    return job.id


def job_row(ctx: Context, job_id: int) -> Job:
    with ctx.db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def over_committed(ctx: Context) -> dict[int, float]:
    with ctx.db.read() as session:
        rows = session.execute(
            select(Allocation.gpu_id, func.sum(Allocation.fraction))
            .where(Allocation.released_at.is_(None))
            .group_by(Allocation.gpu_id)
        ).all()
    return {gpu: total for gpu, total in rows if total > 1.0 + 1e-9}


def test_a_pass_dispatches_and_sends_the_launch_to_the_hosts_queue(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    job_id = submit_job(ctx, caller("alice"), gpus=[1, 2])
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and [p[0] for p in report.placed] == [job_id]
    job = job_row(ctx, job_id)
    assert (job.state, job.host_name) == (JobState.DISPATCHED, "lab-a")
    queued = launches.host_queue(ctx.redis, "lab-a").jobs
    assert [(j.func_name, tuple(j.args)) for j in queued] == [("worker.agent.launch", (job_id, 1))]
    assert queued[0].timeout != 180  # RQ's default is overridden


def test_waiting_jobs_get_their_position_and_reason_in_words(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    alice = caller("alice")
    first = submit_job(ctx, alice, gpus=[0, 1])
    LiveScheduler(ctx).run_pass()
    second = submit_job(ctx, alice, gpus=[1])
    third = submit_job(ctx, alice, gpu_count=2)
    LiveScheduler(ctx).run_pass()
    waiting = [job_row(ctx, second), job_row(ctx, third)]
    assert [j.queue_position for j in waiting] == [1, 2]
    assert waiting[0].pending_reason == f"waiting for GPU 1 on lab-a (job {first})"
    # A count names no GPUs: it takes whichever free up (issue 31: it was told "GPUs 0, 1").
    assert waiting[1].pending_reason == f"waiting for 2 free GPUs on lab-a (job {first})"


def test_a_drained_gpu_gets_no_new_job(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    with ctx.db.write() as session:
        session.execute(update(Gpu).where(Gpu.index == 0).values(drained=True))
    job_id = submit_job(ctx, caller("alice"), gpus=[0])
    other = submit_job(ctx, caller("alice"), gpu_count=1)
    LiveScheduler(ctx).run_pass()
    assert job_row(ctx, job_id).pending_reason == "GPU 0 on lab-a drained or absent"
    with ctx.db.read() as session:
        indices = session.scalars(
            select(Gpu.index).join(Allocation, Allocation.gpu_id == Gpu.id).where(Allocation.job_id == other)
        )
        assert list(indices) == [1]


def test_the_user_gpu_limit_holds_and_a_users_own_limit_overrides_it(
    make_settings: Callable[..., Settings],
    database_url: str,
    caller: Callable[[str], Caller],
    add_host: Callable[..., None],
) -> None:
    ctx = Context.open(make_settings(database_url, user_gpu_limit=2))
    try:
        add_host("lab-a", 4)
        alice = caller("alice")
        ids = [submit_job(ctx, alice, gpu_count=1) for _ in range(3)]
        LiveScheduler(ctx).run_pass()
        assert [job_row(ctx, i).state for i in ids] == [JobState.DISPATCHED, JobState.DISPATCHED, JobState.QUEUED]
        assert job_row(ctx, ids[2]).pending_reason == "user limit: alice uses 2 of 2 GPUs"
        with ctx.db.write() as session:
            session.execute(update(User).where(User.name == "alice").values(gpu_limit=3))
        LiveScheduler(ctx).run_pass()
        assert job_row(ctx, ids[2]).state == JobState.DISPATCHED
    finally:
        ctx.close()


def test_a_session_goes_only_to_a_host_that_runs_sessions(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """In a lab where a worker runs no notebook sessions (a host without JupyterLab, a root
    worker without the sandbox: it says why when it registers), a session is placed only
    where sessions run, and waits for such a host's GPUs while the other host's stand free
    for other jobs; with no such host up it says so. Before, the best fit put the first
    session on the tightest host, the one that refuses sessions, where it failed at start."""
    add_host("lab-a", 1)  # the tightest fit for one GPU
    add_host("lab-b", 2)
    with ctx.db.write() as session:
        refusing = session.scalars(select(Host).where(Host.name == "lab-a")).one()
        refusing.info = {**refusing.info, "no_notebooks": "JupyterLab is not installed (pip install jupyterlab)"}

    one = JobSpec.model_validate({"kind": "notebook", "gpu_count": 1})

    def open_session(who: str) -> int:
        job, _ = submit(ctx.db, caller(who), one.model_copy(), ctx.settings)
        return job.id

    sessions = [open_session(who) for who in ("alice", "bob", "carol")]
    LiveScheduler(ctx).run_pass()
    with ctx.db.read() as session:
        rows = session.execute(select(Allocation.job_id, Host.name).join(Host, Allocation.host_id == Host.id))
        where = {job_id: host for job_id, host in rows}
    assert [where.get(i) for i in sessions] == ["lab-b", "lab-b", None], where
    LiveScheduler(ctx).run_pass()  # they hold lab-b's GPUs now
    waiting = job_row(ctx, sessions[2])
    assert waiting.state == JobState.QUEUED
    assert waiting.pending_reason is not None and "on lab-b" in waiting.pending_reason, waiting.pending_reason
    with ctx.db.read() as session:  # `towerq notebook --dry-run` says the same
        guess = estimate(session, ctx.settings, "erin", one.model_copy(), None)
    assert not guess.starts_now and guess.reason is not None and "on lab-b" in guess.reason, guess
    model = submit_job(ctx, caller("dave"), gpu_count=1)
    LiveScheduler(ctx).run_pass()
    assert job_row(ctx, model).state == JobState.DISPATCHED  # lab-a's GPU: any other job's
    with ctx.db.write() as session:
        session.execute(update(Host).where(Host.name == "lab-b").values(state=HostState.DOWN))
    LiveScheduler(ctx).run_pass()
    waiting = job_row(ctx, sessions[2])
    assert waiting.pending_reason == (
        "no host that may run it is up (a notebook session runs where its worker runs sessions)"
    )


def test_a_session_larger_than_any_host_that_runs_sessions_is_refused_naming_gpu_count(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """Where the big host runs no sessions, a session of its size could never be placed
    (sessions go only where they run): refused at submit, saying where they run, instead of
    waiting for ever."""
    add_host("lab-a", 4)
    add_host("lab-b", 2)
    with ctx.db.write() as session:
        refusing = session.scalars(select(Host).where(Host.name == "lab-a")).one()
        refusing.info = {**refusing.info, "no_notebooks": "JupyterLab is not installed (pip install jupyterlab)"}
    alice = caller("alice")
    with pytest.raises(SpecError, match="^gpu_count: 4 GPUs asked for but the largest host that runs notebook") as err:
        submit(ctx.db, alice, JobSpec.model_validate({"kind": "notebook", "gpu_count": 4}), ctx.settings)
    assert err.value.field == "gpu_count" and "(lab-b; the others run none)" in str(err.value)
    job, _ = submit(ctx.db, alice, JobSpec.model_validate({"kind": "notebook", "gpu_count": 2}), ctx.settings)
    assert job.state == JobState.QUEUED
    model, _ = submit(
        ctx.db, alice, JobSpec.model_validate({"model": "mlp", "dataset": "digits", "gpu_count": 4}), ctx.settings
    )
    assert model.state == JobState.QUEUED, "other jobs take the big host as before"


def test_a_host_that_stops_heartbeating_is_marked_down_and_its_jobs_requeued(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    add_host("lab-b", 2)
    job_id = submit_job(ctx, caller("alice"), host="lab-b", gpus=[0])
    LiveScheduler(ctx).run_pass()
    with ctx.db.write() as session:
        mark_running(session, job_id, 1, {"pid": 1})
        stale = utcnow() - timedelta(seconds=ctx.settings.heartbeat_timeout_s + 5)
        session.execute(update(Host).where(Host.name == "lab-b").values(last_heartbeat_at=stale))
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.repairs.hosts_down == ["lab-b"]
    job = job_row(ctx, job_id)
    assert (job.state, job.attempts, job.crashes) == (JobState.QUEUED, 2, 1)
    assert job.pending_reason == "host lab-b is down or not registered"
    with ctx.db.read() as session:
        assert session.scalar(select(Host.state).where(Host.name == "lab-b")) == HostState.DOWN
        assert session.scalar(select(func.count()).where(Allocation.released_at.is_(None))) == 0


def test_a_launch_lost_with_redis_is_sent_again(
    make_settings: Callable[..., Settings],
    database_url: str,
    caller: Callable[[str], Caller],
    add_host: Callable[..., None],
) -> None:
    ctx = Context.open(make_settings(database_url, dispatch_timeout_s=0.2))
    try:
        add_host("lab-a", 1)
        job_id = submit_job(ctx, caller("alice"))
        LiveScheduler(ctx).run_pass()
        ctx.redis.flushdb()
        time.sleep(0.3)
        report = LiveScheduler(ctx).run_pass()
        assert report is not None and report.repairs.resend == [(job_id, 1, "lab-a", 0)]
        assert [tuple(j.args) for j in launches.host_queue(ctx.redis, "lab-a").jobs] == [(job_id, 1)]
    finally:
        ctx.close()


def test_a_job_over_two_hosts_has_each_lost_launch_sent_again_to_its_own_host(
    make_settings: Callable[..., Settings],
    database_url: str,
    caller: Callable[[str], Caller],
    add_host: Callable[..., None],
) -> None:
    ctx = Context.open(make_settings(database_url, dispatch_timeout_s=0.2))
    try:
        add_host("lab-a", 2)
        add_host("lab-b", 2)
        job_id = submit_job(ctx, caller("alice"), gpu_count=4)
        LiveScheduler(ctx).run_pass()
        first = {h: [j.id for j in launches.host_queue(ctx.redis, h).jobs] for h in ("lab-a", "lab-b")}
        ctx.redis.flushdb()
        time.sleep(0.3)
        report = LiveScheduler(ctx).run_pass()
        chief = job_row(ctx, job_id).host_name  # rank 0's host
        other = "lab-b" if chief == "lab-a" else "lab-a"
        assert report is not None and report.repairs.resend == [(job_id, 1, chief, 0), (job_id, 1, other, 1)]
        again = {h: [j.id for j in launches.host_queue(ctx.redis, h).jobs] for h in ("lab-a", "lab-b")}
        assert again == first and sorted(sum(again.values(), [])) == sorted(
            [launches.launch_id(job_id, 1), launches.launch_id(job_id, 1, 1)]
        )
    finally:
        ctx.close()


def test_a_job_over_two_hosts_is_requeued_when_the_host_of_any_rank_is_lost(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 2)
    add_host("lab-b", 2)
    job_id = submit_job(ctx, caller("alice"), gpu_count=4)
    LiveScheduler(ctx).run_pass()
    with ctx.db.write() as session:
        job = mark_running(session, job_id, 1, {"pid": 1})
        other = "lab-b" if job.host_name == "lab-a" else "lab-a"  # the host of rank 1
        stale = utcnow() - timedelta(seconds=ctx.settings.heartbeat_timeout_s + 5)
        session.execute(update(Host).where(Host.name == other).values(last_heartbeat_at=stale))
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.repairs.hosts_down == [other] and report.repairs.requeued == [job_id]
    job = job_row(ctx, job_id)
    assert (job.state, job.attempts, job.crashes) == (JobState.QUEUED, 2, 1)
    with ctx.db.read() as session:
        assert session.scalar(select(func.count()).where(Allocation.released_at.is_(None))) == 0


def test_a_high_job_asks_the_youngest_low_job_to_make_room_when_preemption_is_on(
    make_settings: Callable[..., Settings],
    database_url: str,
    caller: Callable[[str], Caller],
    add_host: Callable[..., None],
) -> None:
    ctx = Context.open(make_settings(database_url, preemption=True))
    try:
        add_host("lab-a", 1)
        low = submit_job(ctx, caller("bob"), priority="low")
        LiveScheduler(ctx).run_pass()
        pubsub = ctx.redis.pubsub()
        pubsub.subscribe(keys.host_control_channel("lab-a"))
        high = submit_job(ctx, caller("alice"), priority="high")
        report = LiveScheduler(ctx).run_pass()
        assert report is not None and report.preempted == [low]
        assert job_row(ctx, low).preempt_requested_at is not None
        assert job_row(ctx, high).pending_reason == f"stopping lower-priority job {low} on lab-a to make room"
        messages = [m for m in (pubsub.get_message(timeout=1) for _ in range(3)) if m and m["type"] == "message"]
        assert messages and b'"type": "preempt"' in messages[0]["data"]
    finally:
        ctx.close()


def backdate_allocations(ctx: Context, job_id: int, seconds: float) -> None:
    """As if the job's current attempt had started `seconds` ago."""
    with ctx.db.write() as session:
        session.execute(
            update(Allocation)
            .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
            .values(created_at=utcnow() - timedelta(seconds=seconds))
        )


def long_job_and_a_fresh_one(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None], ran_s: float
) -> tuple[int, int, PassReport | None]:
    """bob's job has run `ran_s` on lab-a's one GPU when alice submits one: the two jobs,
    and the pass after."""
    add_host("lab-a", 1)
    long = submit_job(ctx, caller("bob"))
    LiveScheduler(ctx).run_pass()
    with ctx.db.write() as session:
        mark_running(session, long, 1, {"pid": 1})
    backdate_allocations(ctx, long, ran_s)
    fresh = submit_job(ctx, caller("alice"))
    return long, fresh, LiveScheduler(ctx).run_pass()


def test_time_slicing_stops_a_job_past_its_slice_for_fresh_work_and_it_resumes_with_its_served_time(
    make_settings: Callable[..., Settings],
    database_url: str,
    caller: Callable[[str], Caller],
    add_host: Callable[..., None],
) -> None:
    ctx = Context.open(make_settings(database_url, time_slice_gpu_s=3600))
    try:
        long, fresh, report = long_job_and_a_fresh_one(ctx, caller, add_host, 1800)  # half a slice
        assert report is not None and report.preempted == [], "nobody may stop it yet"
        assert job_row(ctx, fresh).pending_reason == f"waiting for 1 free GPU on lab-a (job {long})"

        backdate_allocations(ctx, long, 7200)  # two GPU-hours: past its slice
        pubsub = ctx.redis.pubsub()
        pubsub.subscribe(keys.host_control_channel("lab-a"))
        report = LiveScheduler(ctx).run_pass()
        assert report is not None and report.preempted == [long]
        assert job_row(ctx, fresh).pending_reason == f"stopping job {long} on lab-a (had their time slice) to make room"
        messages = [m for m in (pubsub.get_message(timeout=1) for _ in range(3)) if m and m["type"] == "message"]
        control = json.loads(messages[0]["data"])
        assert control["type"] == "preempt" and control["reason"].startswith("had its time slice (2.0 GPU-hours")
        assert f"to make room for job {fresh}" in control["reason"]

        with ctx.db.write() as session:  # what the worker does once the trainer has checkpointed
            requeue(session, locked_job(session, long), control["reason"], crashed=False)
        report = LiveScheduler(ctx).run_pass()
        assert report is not None and [p[0] for p in report.placed] == [fresh]
        with ctx.db.read() as session:
            queued, _ = read_queued(session)
        assert [(q.id, round(q.served_gpu_s, -1)) for q in queued] == [(long, 7200)]
        assert job_row(ctx, long).attempts == 2 and job_row(ctx, long).crashes == 0

        with ctx.db.write() as session:
            finish(session, fresh, 1, JobState.SUCCEEDED)
        report = LiveScheduler(ctx).run_pass()
        assert report is not None and [p[0] for p in report.placed] == [long]
        with ctx.db.read() as session:
            cluster, _ = read_cluster(session)
        assert [(r.id, round(r.served_gpu_s, -1)) for r in cluster.running] == [(long, 7200)]
        # Its second attempt is young: fresh work waits for it rather than stopping it again.
        later = submit_job(ctx, caller("alice"))
        report = LiveScheduler(ctx).run_pass()
        assert report is not None and report.preempted == []
        assert job_row(ctx, later).pending_reason == f"waiting for 1 free GPU on lab-a (job {long})"
    finally:
        ctx.close()


def test_time_slicing_off_stops_nobody(
    make_settings: Callable[..., Settings],
    database_url: str,
    caller: Callable[[str], Caller],
    add_host: Callable[..., None],
) -> None:
    ctx = Context.open(make_settings(database_url, time_slice_gpu_s=0))
    try:
        long, fresh, report = long_job_and_a_fresh_one(ctx, caller, add_host, 86400)
        assert report is not None and report.preempted == []
        assert job_row(ctx, fresh).pending_reason == f"waiting for 1 free GPU on lab-a (job {long})"
    finally:
        ctx.close()


@pytest.mark.slow
def test_concurrent_submits_finishes_and_passes_never_over_commit_a_gpu(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    add_host("lab-b", 4)
    users = [caller(name) for name in ("alice", "bob", "carol")]
    stop = threading.Event()
    errors: list[BaseException] = []
    samples: list[dict[int, float]] = []

    def guarded(work: Callable[[], None], pause: float = 0.002) -> Callable[[], None]:
        def loop() -> None:
            try:
                while not stop.is_set():
                    work()
                    time.sleep(pause)
            except BaseException as err:  # noqa: BLE001 - reported by the test below
                errors.append(err)
                stop.set()

        return loop

    rng = random.Random(7)

    def submitter() -> None:
        spec = rng.choice(
            [
                {"gpu_count": 1},
                {"gpu_count": 2},
                {"gpu_count": 1, "gpu_memory_fraction": 0.5},
                {"gpu_count": 4, "gpu_memory_fraction": 0.3},
                {"host": "lab-b", "gpus": [3]},
            ]
        )
        submit_job(ctx, rng.choice(users), **spec)

    scheduler = LiveScheduler(ctx)
    other_scheduler = LiveScheduler(ctx)

    def finisher() -> None:
        with ctx.db.read() as session:
            running = session.execute(select(Job.id, Job.attempts).where(Job.state == JobState.DISPATCHED)).all()
        for job_id, attempt in running[:3]:
            with ctx.db.write() as session:
                finish(session, job_id, attempt, JobState.SUCCEEDED)

    def sampler() -> None:
        samples.append(over_committed(ctx))

    loops = [guarded(submitter), guarded(submitter), guarded(finisher), guarded(sampler, 0.02)]
    loops += [guarded(lambda: scheduler.run_pass()), guarded(lambda: other_scheduler.run_pass())]
    threads = [threading.Thread(target=loop) for loop in loops]
    for thread in threads:
        thread.start()
    time.sleep(6)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(samples) > 10
    assert all(sample == {} for sample in samples), [s for s in samples if s]
    with ctx.db.read() as session:
        counts = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    print(counts, len(samples))
    assert counts.get(JobState.SUCCEEDED, 0) > 10, "the hammer must have scheduled and finished many jobs"
    assert over_committed(ctx) == {}


def behind_an_hour_long_job(ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]) -> list[int]:
    """A job with a one-hour limit placed on both GPUs of lab-a, then a two-GPU job with a
    ten-minute limit and a one-GPU job submitted behind it: their ids, in that order."""
    add_host("lab-a", 2)
    alice = caller("alice")
    first = submit_job(ctx, alice, gpus=[0, 1], time_limit_s=3600)
    LiveScheduler(ctx).run_pass()
    return [first, submit_job(ctx, alice, gpu_count=2, time_limit_s=600), submit_job(ctx, alice, gpu_count=1)]


@pytest.mark.usefixtures("whole_replays")
def test_waiting_jobs_get_an_expected_start_from_the_replay_and_lose_it_when_they_start(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """A job with a one-hour limit holds both GPUs: the queue is replayed forward from there."""
    first, second, third = behind_an_hour_long_job(ctx, caller, add_host)
    LiveScheduler(ctx).run_pass()
    with ctx.db.read() as session:
        first_allocated = session.scalar(select(func.min(Allocation.created_at)).where(Allocation.job_id == first))
    waiting = [job_row(ctx, second), job_row(ctx, third)]
    assert [j.expected_host for j in waiting] == ["lab-a", "lab-a"]
    assert waiting[0].expected_start_at is not None and waiting[1].expected_start_at is not None
    assert first_allocated is not None
    # the two-GPU job with a ten-minute limit goes first (a tight limit outranks no limit,
    # more than its size costs it), once time slicing has stopped the first job: on two
    # GPUs it has had its GPU-hour after 30 minutes, and it takes CHECKPOINT_S to stop;
    # the one-GPU job follows when that limit is up
    assert abs((waiting[0].expected_start_at - first_allocated).total_seconds() - (1800 + CHECKPOINT_S)) < 2
    assert abs((waiting[1].expected_start_at - first_allocated).total_seconds() - (2400 + CHECKPOINT_S)) < 2
    with ctx.db.write() as session:
        job = session.get(Job, first)
        assert job is not None
        finish(session, first, job.attempts, JobState.SUCCEEDED)
    LiveScheduler(ctx).run_pass()
    started = job_row(ctx, second)  # first in line, as the replay said
    assert started.state == JobState.DISPATCHED and started.expected_start_at is None
    assert job_row(ctx, third).expected_start_at is not None


def running_with_450_s_to_go(ctx: Context, job_id: int) -> None:
    """The dispatched job of 1000 steps runs, its pace measured: step 100 now, 0.5 s a step."""
    with ctx.db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.state, job.step, job.step_at, job.pace_s = JobState.RUNNING, 100, utcnow(), 0.5


@pytest.mark.usefixtures("whole_replays")
def test_a_waiting_jobs_expected_start_is_the_running_jobs_eta(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """Once the worker has measured a running job's pace, the job behind it expects to start
    when that job's page says it ends, not at a guess from its age (issue 49: the estimate
    jumped from ~05:02 to ~04:32 in a minute)."""
    add_host("lab-a", 1)
    alice = caller("alice")
    first = submit_job(ctx, alice, hyperparameters={"steps": 1000})
    LiveScheduler(ctx).run_pass()
    running_with_450_s_to_go(ctx, first)
    second = submit_job(ctx, alice)
    LiveScheduler(ctx).run_pass()
    ends, starts = job_row(ctx, first).expected_end_at, job_row(ctx, second).expected_start_at
    assert ends is not None and starts is not None
    assert abs((starts - ends).total_seconds()) <= 1, (starts, ends)


@pytest.mark.usefixtures("whole_replays")
def test_a_waiting_jobs_reason_names_the_job_it_is_expected_to_follow(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """The reason names the GPU and the job whose end the expected start waits for: of two
    running jobs, one with three hours of time limit and one whose measured pace ends it in
    about 450 s, the job waiting for a GPU expects to start as the second ends, and its reason
    names that job and that end, not the first one's time limit (the reason chose by time
    limits and said `job 1, ends ~22:40` beside `starts ~19:42`)."""
    add_host("lab-a", 2)
    alice = caller("alice")
    limited = submit_job(ctx, alice, time_limit_s=3 * 3600)
    paced = submit_job(ctx, alice, hyperparameters={"steps": 1000})
    LiveScheduler(ctx).run_pass()
    running_with_450_s_to_go(ctx, paced)
    waiting = submit_job(ctx, alice)
    LiveScheduler(ctx).run_pass()
    row, ends = job_row(ctx, waiting), job_row(ctx, paced).expected_end_at
    assert row.expected_start_at is not None and ends is not None
    assert abs((row.expected_start_at - ends).total_seconds()) <= 1
    assert row.pending_reason is not None and f"(job {paced}, ends ~" in row.pending_reason, row.pending_reason
    assert f"job {limited}" not in row.pending_reason
    said = row.pending_reason.split("ends ~")[1][:5]  # the page's ETA, to the minute (a second either way)
    assert said in {(ends + timedelta(seconds=d)).astimezone().strftime("%H:%M") for d in (-1, 0, 1)}, ends


def test_a_replay_longer_than_its_slice_goes_on_between_passes_until_a_pass_is_asked_for(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a slice of one policy call, the pass that starts the replay writes positions but
    no expected start yet; a pass asked for stops the work between passes, and each pass
    goes on with it by one slice; once it is over between passes, a pass is asked for, and
    that pass writes the same expected starts as a replay done at once."""
    monkeypatch.setattr(defaults, "FORECAST_SLICE_S", 0.0)
    first, second, third = behind_an_hour_long_job(ctx, caller, add_host)
    scheduler = LiveScheduler(ctx)  # one that has not just replayed (see FORECAST_COST_RATIO)
    scheduler.run_pass()
    assert scheduler.forecasting
    waiting = [job_row(ctx, second), job_row(ctx, third)]
    assert [j.queue_position for j in waiting] == [1, 2]
    assert [j.expected_start_at for j in waiting] == [None, None]

    ctx.redis.lpush(keys.SCHEDULER_KICK, 1)  # a pass is asked for: the replay waits for it
    stop = threading.Event()
    forecast_between_passes(ctx, scheduler, stop)
    assert scheduler.forecasting and scheduler.replay is not None
    events = scheduler.replay.events
    ctx.redis.delete(keys.SCHEDULER_KICK)
    scheduler.run_pass()  # one slice more
    assert scheduler.replay is not None and scheduler.replay.events > events

    forecast_between_passes(ctx, scheduler, stop)
    assert not scheduler.forecasting
    assert ctx.redis.llen(keys.SCHEDULER_KICK) == 1  # the pass that writes what it found
    scheduler.run_pass()
    with ctx.db.read() as session:
        first_allocated = session.scalar(select(func.min(Allocation.created_at)).where(Allocation.job_id == first))
    assert first_allocated is not None
    waiting = [job_row(ctx, second), job_row(ctx, third)]
    assert [j.expected_host for j in waiting] == ["lab-a", "lab-a"]
    starts = [(j.expected_start_at - first_allocated).total_seconds() for j in waiting if j.expected_start_at]
    assert len(starts) == 2
    assert abs(starts[0] - (1800 + CHECKPOINT_S)) < 2 and abs(starts[1] - (2400 + CHECKPOINT_S)) < 2


def test_a_job_that_comes_during_a_replay_is_owed_the_next_one_as_soon_as_the_cost_ratio_allows(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(defaults, "FORECAST_SLICE_S", 0.0)
    add_host("lab-a", 2)
    alice = caller("alice")
    submit_job(ctx, alice, gpus=[0, 1], time_limit_s=3600)
    LiveScheduler(ctx).run_pass()
    second = submit_job(ctx, alice, gpu_count=2, time_limit_s=600)
    scheduler = LiveScheduler(ctx)
    scheduler.run_pass()
    assert scheduler.forecasting and scheduler.replay_owed_at is None
    third = submit_job(ctx, alice, gpu_count=1)
    scheduler.run_pass()  # the third job comes while the replay goes on
    stop = threading.Event()
    ctx.redis.delete(keys.SCHEDULER_KICK)  # (the submissions asked for passes)
    forecast_between_passes(ctx, scheduler, stop)
    monkeypatch.setattr(defaults, "FORECAST_COST_RATIO", 1e6)  # the next replay is not due yet
    scheduler.run_pass()
    assert job_row(ctx, second).expected_start_at is not None and job_row(ctx, third).expected_start_at is None
    owed = scheduler.replay_owed_at
    assert owed is not None and owed > time.monotonic() + 60 and not scheduler.forecasting
    monkeypatch.setattr(defaults, "FORECAST_COST_RATIO", 0.0)  # now it is: the pass starts it
    assert scheduler.replay_owed_at is not None and scheduler.replay_owed_at <= time.monotonic()
    scheduler.run_pass()
    assert scheduler.forecasting and scheduler.replay_owed_at is None
    ctx.redis.delete(keys.SCHEDULER_KICK)
    forecast_between_passes(ctx, scheduler, stop)
    scheduler.run_pass()
    assert job_row(ctx, third).expected_start_at is not None


def test_a_job_that_comes_before_the_next_replay_is_due_is_owed_it_as_soon_as_the_cost_ratio_allows(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only during a replay: a job that comes while the last replay's cost still holds
    the next one back gets it when the ratio allows (`serve` wakes then), not at the next
    timed pass."""
    add_host("lab-a", 2)
    alice = caller("alice")
    submit_job(ctx, alice, gpus=[0, 1], time_limit_s=3600)
    scheduler = LiveScheduler(ctx)
    scheduler.run_pass()
    second = submit_job(ctx, alice, gpu_count=2, time_limit_s=600)
    monkeypatch.setattr(defaults, "FORECAST_COST_RATIO", 0.0)
    scheduler.run_pass()
    stop = threading.Event()
    ctx.redis.delete(keys.SCHEDULER_KICK)
    forecast_between_passes(ctx, scheduler, stop)
    scheduler.run_pass()
    assert job_row(ctx, second).expected_start_at is not None and not scheduler.forecasting
    assert scheduler.replay_owed_at is None

    monkeypatch.setattr(defaults, "FORECAST_COST_RATIO", 1e6)  # the last replay's cost holds the next back
    third = submit_job(ctx, alice, gpu_count=1)
    scheduler.run_pass()
    assert job_row(ctx, third).queue_position == 2 and job_row(ctx, third).expected_start_at is None
    owed = scheduler.replay_owed_at
    assert owed is not None and owed > time.monotonic() + 60 and not scheduler.forecasting
    monkeypatch.setattr(defaults, "FORECAST_COST_RATIO", 0.0)
    assert scheduler.replay_owed_at is not None and scheduler.replay_owed_at <= time.monotonic()
    scheduler.run_pass()
    ctx.redis.delete(keys.SCHEDULER_KICK)
    forecast_between_passes(ctx, scheduler, stop)
    scheduler.run_pass()
    assert job_row(ctx, third).expected_start_at is not None and scheduler.replay_owed_at is None


def test_the_scheduler_finishes_a_long_replay_between_passes_and_asks_for_the_pass_that_writes_it(
    settings: Settings,
    caller: Callable[[str], Caller],
    add_host: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`towerq scheduler`'s loop, with a slice of one policy call and a 30 s timer: the
    expected starts are written within seconds of the kick, so by the pass the finished
    replay asks for, not by the timer; and a timer longer than the Redis client's socket
    timeout is waited out without "Redis unavailable"."""
    monkeypatch.setattr(defaults, "FORECAST_SLICE_S", 0.0)
    ctx = Context.open(settings.model_copy(update={"scheduler_interval_s": 30.0}))
    add_host("lab-a", 2)
    alice = caller("alice")
    first = submit_job(ctx, alice, gpus=[0, 1], time_limit_s=3600)
    stop = threading.Event()
    loop = threading.Thread(target=serve, args=(ctx, stop))
    try:
        loop.start()
        ctx.redis.lpush(keys.SCHEDULER_KICK, 1)
        wait_for(lambda: job_row(ctx, first).state == JobState.DISPATCHED, 10, "the first job placed")
        time.sleep(1.0)  # the first replay (of nothing) is FORECAST_COST_RATIO times its cost behind
        waiting = [submit_job(ctx, alice, gpu_count=2, time_limit_s=600), submit_job(ctx, alice, gpu_count=1)]
        kicked = time.monotonic()
        ctx.redis.lpush(keys.SCHEDULER_KICK, 1)
        wait_for(lambda: all(job_row(ctx, j).expected_start_at is not None for j in waiting), 15, "expected starts")
        assert time.monotonic() - kicked < 10
        assert [job_row(ctx, j).expected_host for j in waiting] == ["lab-a", "lab-a"]
        time.sleep(11)  # past the client's socket timeout, waiting for a kick
    finally:
        stop.set()
        ctx.redis.lpush(keys.SCHEDULER_KICK, 1)  # out of its wait for a kick
        loop.join(30)
        gc.unfreeze()  # what the loop froze at its start: this process goes on
        ctx.close()
    assert not loop.is_alive()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.usefixtures("whole_replays")
def test_a_pass_that_writes_the_queue_writes_expected_starts_from_its_own_state(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """One scheduler, passes in quick succession: a high-priority job submitted after the
    first pass moves the waiting job's expected start in the very next pass (never an
    expected start replayed from an older pass's queue)."""
    add_host("lab-a", 2)
    scheduler = LiveScheduler(ctx)
    first = submit_job(ctx, caller("alice"), gpus=[0, 1], time_limit_s=3600)
    scheduler.run_pass()
    waiting = submit_job(ctx, caller("alice"), gpu_count=2, time_limit_s=600)
    scheduler.run_pass()
    with ctx.db.read() as session:
        held_from = session.scalar(select(func.min(Allocation.created_at)).where(Allocation.job_id == first))
    assert held_from is not None
    before = job_row(ctx, waiting).expected_start_at
    # time slicing stops the first job once it has had its GPU-hour (30 min on two GPUs)
    assert before is not None and abs((before - held_from).total_seconds() - (1800 + CHECKPOINT_S)) < 2

    urgent = submit_job(ctx, caller("bob"), gpu_count=2, time_limit_s=900, priority="high")
    scheduler.run_pass()
    after, ahead = job_row(ctx, waiting), job_row(ctx, urgent)
    assert ahead.expected_start_at == before and ahead.queue_position == 1
    assert after.expected_start_at is not None and after.queue_position == 2
    assert abs((after.expected_start_at - held_from).total_seconds() - (1800 + CHECKPOINT_S + 900)) < 2


def test_a_job_waits_for_the_jobs_it_names_and_is_cancelled_when_one_it_needs_fails(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    alice = caller("alice")
    first, second = submit_job(ctx, alice), submit_job(ctx, alice)
    after_both = submit_job(ctx, alice, after=[first, second])
    after_any = submit_job(ctx, alice, after=[second], after_condition="afterany")
    scheduler = LiveScheduler(ctx)
    report = scheduler.run_pass()
    assert report is not None and sorted(p[0] for p in report.placed) == [first, second]
    assert job_row(ctx, after_both).reason == f"waiting for job {first} to succeed (and 1 more)"
    assert job_row(ctx, after_any).reason == f"waiting for job {second} to end"

    with ctx.db.write() as session:
        finish(session, first, 1, JobState.SUCCEEDED)
    scheduler.pending_written_at = float("-inf")  # the next pass rewrites the reasons
    scheduler.run_pass()
    assert job_row(ctx, after_both).reason == f"waiting for job {second} to succeed"

    with ctx.db.write() as session:
        finish(session, second, 1, JobState.FAILED, error="diverged")
    report = scheduler.run_pass()
    assert report is not None and [p[0] for p in report.placed] == [after_any]  # ended is enough for it
    cancelled = job_row(ctx, after_both)
    assert cancelled.state == JobState.CANCELLED
    assert cancelled.reason == f"job {second}, which it waits for, failed: it could never start (afterok)"
    assert cancelled.finished_at is not None and cancelled.cancel_requested_at is not None


def test_the_policy_runs_with_the_collector_paused_and_it_runs_again_after(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass builds its queue anew: collections inside the policy's call, now and then a
    full one walking all of it, would land in the pass's time (`live.collector_paused`)."""
    import service.scheduler.live as live

    add_host("lab-a", 2)
    job_id = submit_job(ctx, caller("alice"), gpus=[0])
    collections: list[int] = []
    seen: list[bool] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    def allocating(*args: object, **kwargs: object):  # noqa: ANN202
        seen.append(gc.isenabled())
        before = len(collections)
        garbage = []
        for _ in range(20_000):  # enough allocations for several collections
            cycle: list[object] = []
            cycle.append(cycle)
            garbage.append(cycle)
        del garbage
        seen.append(len(collections) == before)
        return schedule(*args, **kwargs)

    schedule = live.schedule
    monkeypatch.setattr(live, "schedule", allocating)
    gc.callbacks.append(count)
    try:
        report = LiveScheduler(ctx).run_pass()
        assert gc.isenabled(), "on again after the pass"
        gc.disable()
        try:
            LiveScheduler(ctx).run_pass()
            assert not gc.isenabled(), "a collector that was off stays off"
        finally:
            gc.enable()
    finally:
        gc.callbacks.remove(count)
    assert report is not None and [p[0] for p in report.placed] == [job_id]
    assert seen[:2] == [False, True], "paused, and no collection inside the policy's call"
