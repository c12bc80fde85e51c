"""The attempt protocol (`towerq.contract.attempts`), the same in both its implementations:
in the supervisor's own process (`service.core.attempts.LocalChannel`) and over HTTP with
the attempt's token (`towerq.attempts.HttpChannel`, the API's `/api/attempts`). What an
attempt is told of itself, and that everything it writes is fenced by it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import distinct, func, select, update

from service.api.app import create_app
from service.core import keys
from service.core.attempts import LocalChannel, mint_attempt_token
from service.core.context import Context
from service.core.exceptions import NotFoundError, StaleAttemptError
from service.core.lifecycle import STOPPED_EARLY, locked_job, requeue
from service.core.models import Allocation, Job, JobEvent, JobState, LogLine, Metric, Notification, RankAddress
from service.core.settings import Settings
from service.core.slurm_nodes import address_command, parse_address
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from towerq.attempts import HttpChannel
from towerq.contract.attempts import (
    AttemptChannel,
    AttemptEnd,
    AttemptStatus,
    MetricRow,
    Refused,
    Report,
    StaleAttempt,
    Stored,
)
from towerq.contract.messages import LogMessage, encode
from towerq.contract.spec import JobSpec
from worker.attempt_disk import fate_of_attempts

# The HTTP channel asks its status with a timeout of its own; Starlette's test client warns
# that it does not apply one (the real API does).
pytestmark = pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument with the TestClient")
BODY = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 400}}


@pytest.fixture
def ctx(settings: Settings, add_host: Callable[..., None]) -> Iterator[Context]:
    add_host("lab-a", 1)
    context = Context.open(settings)
    yield context
    context.close()


Opener = Callable[[int, int], AttemptChannel]


@pytest.fixture(params=["local", "http"])
def channel_to(request: pytest.FixtureRequest, ctx: Context, settings: Settings) -> Iterator[Opener]:
    """Opens an attempt's channel; over HTTP with a token minted for it as a hand-over does."""
    if request.param == "local":
        yield lambda job_id, attempt: LocalChannel(ctx, job_id, attempt)
        return

    def over_http(job_id: int, attempt: int) -> AttemptChannel:
        try:
            with ctx.db.write() as session:
                token = mint_attempt_token(session, job_id, attempt)
        except (StaleAttemptError, NotFoundError):
            token = "tqa_for-no-live-attempt"
        return HttpChannel("http://testserver", token, job_id, attempt, http=client)

    with TestClient(create_app(settings)) as client:
        yield over_http


def dispatched(ctx: Context, base: dict | None = None, **body: object) -> int:
    with ctx.db.write() as session:
        user = ensure_user(session, "alice")
        caller = Caller(user.id, user.name, False, 0)
    spec = JobSpec.model_validate({**(BODY if base is None else base), **body})
    job_id = submit(ctx.db, caller, spec, ctx.settings)[0].id
    LiveScheduler(ctx).run_pass()
    return job_id


def job(ctx: Context, job_id: int) -> Job:
    with ctx.db.read() as session:
        row = session.get(Job, job_id)
        assert row is not None
        session.expunge(row)
        return row


def point(job_id: int, step: int) -> MetricRow:
    return MetricRow(
        job_id=job_id, attempt=1, step=step, split="train", loss=1.0 / step, accuracy=0.5,
        learning_rate=0.1, examples_per_sec=10.0, custom=None, time=datetime.now(UTC),
    )  # fmt: skip


def line(job_id: int, message: str) -> dict:
    return {"job_id": job_id, "attempt": 1, "time": datetime.now(UTC), "level": "info", "message": message}


def set_job(ctx: Context, job_id: int, **values: object) -> None:
    with ctx.db.write() as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values))


def test_an_attempt_learns_whether_it_is_current_and_which_stop_was_asked(ctx: Context, channel_to: Opener) -> None:
    job_id = dispatched(ctx)
    channel = channel_to(job_id, 1)
    assert channel.status() == AttemptStatus(current=True, limit_known=True)  # no time limit
    set_job(ctx, job_id, time_limit_s=90)  # `towerq update --time-limit`: the runner follows it
    assert channel.status() == AttemptStatus(current=True, time_limit_s=90, limit_known=True)
    channel.running(4321, "0", "/artifacts/1")
    assert (job(ctx, job_id).state, job(ctx, job_id).pid) == (JobState.RUNNING, 4321)
    with pytest.raises(StaleAttempt):
        channel.running(4322, "0", "/artifacts/1")  # an attempt starts once

    now = datetime.now(UTC)
    set_job(ctx, job_id, cancel_requested_at=now)
    said = AttemptStatus(current=True, stop="cancel", reason="cancelled", time_limit_s=90, limit_known=True)
    assert channel.status() == said
    set_job(ctx, job_id, stop_reason=f"{STOPPED_EARLY}: behind at step 100")
    assert channel.status().stop == "sweep"
    set_job(ctx, job_id, cancel_requested_at=None, stop_reason=None, preempt_requested_at=now)
    status = channel.status()
    assert status.stop == "preempt" and status.reason is not None and "resumes from its checkpoint" in status.reason

    set_job(ctx, job_id, attempts=2)
    assert channel.status() == AttemptStatus(current=False)
    assert channel_to(job_id + 1000, 1).status() == AttemptStatus(current=False)


def test_a_sessions_door_is_recorded_where_the_proxy_reads_it_and_forgotten(ctx: Context, channel_to: Opener) -> None:
    job_id = dispatched(ctx, {"kind": "notebook", "gpus": [0]})
    port = ctx.settings.rank_port_range[0]

    def doors() -> list[tuple[int, int, str, str]]:
        with ctx.db.read() as session:
            rows = session.execute(select(RankAddress.attempt, RankAddress.rank, RankAddress.address, RankAddress.key))
            return [(row[0], row[1], row[2], row[3]) for row in rows]

    channel = channel_to(job_id, 1)
    channel.open_door(f"lab-a:{port}", "cd" * 32)
    assert doors() == [(1, 0, f"lab-a:{port}", "cd" * 32)]  # rank 0 of the attempt: the proxy's `_door`
    channel.close_door()
    assert doors() == []
    if isinstance(channel, HttpChannel):  # the API's checks (tests/security/test_attempt_tokens.py), in its words
        with pytest.raises(Refused, match=r"^address: the door's port is one of TOWERQ_RANK_PORTS") as refused:
            channel.open_door(f"lab-a:{port - 1}", "cd" * 32)
        assert not refused.value.passing and doors() == []
    set_job(ctx, job_id, attempts=2)
    with pytest.raises(StaleAttempt):
        channel_to(job_id, 1).open_door(f"lab-a:{port}", "cd" * 32)  # the job moved on
    assert doors() == []


def test_a_report_is_stored_only_while_its_attempt_is_current(ctx: Context, channel_to: Opener) -> None:
    job_id = dispatched(ctx)
    channel = channel_to(job_id, 1)
    channel.running(4321, "0", "/artifacts/1")
    channel.report(Report([point(job_id, 10)], [line(job_id, "hello")], {"step": 10, "loss": 0.1}, 70))
    stored = job(ctx, job_id)
    assert (stored.step, stored.loss, stored.log_bytes, stored.metric_points) == (10, 0.1, 70, 1)
    assert channel.stored() == Stored(log_bytes=70, metric_points=1)

    with pytest.raises(ValueError, match="state"):  # nothing of the row but its figures
        channel.report(Report([point(job_id, 20)], [], {"state": "succeeded", "step": 20}, 0))
    assert (job(ctx, job_id).state, job(ctx, job_id).step) == (JobState.RUNNING, 10)
    channel.report(Report([point(job_id, 11), point(job_id, 12)], [], {}, 0))
    channel.forget_after(10)  # trained again by a resumed attempt: they count no more
    assert channel.stored().metric_points == 1

    channel.end(AttemptEnd("failed", "it broke", exit_code=1))
    assert (job(ctx, job_id).state, job(ctx, job_id).error, job(ctx, job_id).exit_code) == ("failed", "it broke", 1)
    with pytest.raises(StaleAttempt):
        channel.report(Report([point(job_id, 30)], [line(job_id, "late")], {"step": 30}, 70))
    # its last words (it stopped with the other ranks): the lines are kept, not the numbers;
    # over HTTP the attempt's token ended with it, and nothing is taken
    last = Report([point(job_id, 40)], [line(job_id, "last")], {"step": 40}, 70, last_words=True)
    if isinstance(channel, HttpChannel):
        with pytest.raises(StaleAttempt):
            channel.report(last)
    else:
        channel.report(last)
    with ctx.db.read() as session:
        messages = session.scalars(select(LogLine.message).where(LogLine.job_id == job_id)).all()
        points = session.scalar(select(func.count()).select_from(Metric).where(Metric.job_id == job_id))
    assert messages == (["hello"] if isinstance(channel, HttpChannel) else ["hello", "last"]) and points == 1
    assert (job(ctx, job_id).step, job(ctx, job_id).log_bytes) == (10, 70)
    for late in (lambda: channel.forget_after(0), lambda: channel.end(AttemptEnd("succeeded"))):
        with pytest.raises(StaleAttempt):
            late()


def test_a_running_job_whose_gpus_go_idle_owes_its_webhooks_once_for_each_idle_stretch(
    ctx: Context, channel_to: Opener
) -> None:
    """`job.idle` to the lab's webhook and the job's own, from the report that says every rank
    of the running attempt has found its GPUs idle past the warning time; again only after
    they were busy in between (and a warning time after the last: a stretch lasts that long)."""
    job_id = dispatched(ctx, notify_url="https://hooks.example/mine")  # its ranks: as over two hosts
    channel = channel_to(job_id, 1)
    channel.running(4321, "0", "/artifacts/1")

    def say(rank: int, idle_since: str | None) -> None:
        use = {"rank": rank, "gpus": 1, "samples": 5, "busy_pct": 1.0, "memory_total_mb": 81559}
        channel.report(Report([], [], {"gpu_use": {**use, "idle_since": idle_since}}, 0))

    def owed() -> list[tuple[str, str | None]]:
        with ctx.db.read() as session:
            rows = session.execute(select(Notification.event, Notification.url).where(Notification.job_id == job_id))
            return [tuple(row) for row in rows]

    say(0, None)
    say(1, None)
    say(0, "2026-12-06T08:00:00Z")
    assert owed() == []  # rank 1's GPUs are busy: the job is not idle
    say(1, "2026-12-06T08:01:00Z")
    mine = "https://hooks.example/mine"
    assert sorted(owed(), key=str) == [("job.idle", mine), ("job.idle", None)]
    say(1, "2026-12-06T08:01:00Z")  # still idle: nothing more
    with ctx.db.write() as session:  # told a warning time ago (the lab's: 30 min)
        session.execute(update(Notification).values(created_at=datetime.now(UTC) - timedelta(minutes=31)))
    say(0, None)  # busy again, then idle again: owed again
    assert len(owed()) == 2
    say(0, "2026-12-06T09:00:00Z")
    assert len(owed()) == 4
    channel.end(AttemptEnd("succeeded"))
    assert owed().count(("job.finished", mine)) == 1 and len(owed()) == 6


def test_a_job_over_two_hosts_is_asked_to_stop_once_every_ranks_gpus_were_idle_the_labs_stop_time(
    ctx: Context, channel_to: Opener, add_host: Callable[..., None]
) -> None:
    """TOWERQ_GPU_IDLE_STOP_S over several hosts: each rank's worker sees only its own GPUs,
    so the job is asked to stop (`gpu_idle`, every rank) once every rank's figures say its GPUs
    have been idle that long, not while one rank's are busy; a cancel asked meanwhile comes
    first; a crash it ends with then is the stop (its program saw the others go first). A job
    on one host is its worker's to stop: its figures alone never ask it."""
    ctx.settings.gpu_idle_stop_s = 3600
    idle = datetime.now(UTC) - timedelta(minutes=70)
    alone = dispatched(ctx, hyperparameters={"steps": 10})
    one = channel_to(alone, 1)
    for rank in (0, 1):  # as if two ranks said so: its allocation is on one host
        use = {"rank": rank, "gpus": 1, "samples": 5, "busy_pct": 1.0, "idle_stop_since": idle}
        one.report(Report([], [], {"gpu_use": use}, 0))
    assert one.status().stop is None
    one.end(AttemptEnd("succeeded"))

    add_host("lab-b", 1)
    job_id = dispatched(ctx, gpus=None, gpu_count=2)  # a GPU on each of lab-a and lab-b
    with ctx.db.read() as session:
        assert session.scalar(select(func.count(distinct(Allocation.host_id))).where(Allocation.job_id == job_id)) == 2
    channel = channel_to(job_id, 1)
    channel.running(4321, "0", "/artifacts/1")

    def say(rank: int, since: datetime | None) -> AttemptStatus:
        use = {"rank": rank, "gpus": 1, "samples": 5, "busy_pct": 1.0, "memory_total_mb": 81559}
        channel.report(Report([], [], {"gpu_use": {**use, "idle_stop_since": since}}, 0))
        return channel.status()

    assert say(0, idle).stop is None  # rank 1 has not said yet
    assert say(1, None).stop is None  # rank 1's GPUs are busy
    status = say(1, idle + timedelta(minutes=5))
    assert status.stop == "gpu_idle", status
    assert status.reason == (
        "stopped: its GPUs were idle for 1h5m on each of its 2 hosts (busy under 5% at every sample; the lab stops "
        "a job whose GPUs stay idle 1h: TOWERQ_GPU_IDLE_STOP_S)"
    )
    set_job(ctx, job_id, cancel_requested_at=datetime.now(UTC))
    assert channel.status().stop == "cancel"
    set_job(ctx, job_id, cancel_requested_at=None)
    assert say(0, None).stop is None  # busy again
    assert say(0, idle).stop == "gpu_idle"
    # rank 0's program saw rank 1's stopped before its worker read the stop: its crash is the stop
    channel.end(AttemptEnd("queued", "lab-b: exit code 1", exit_code=1, crashed=True))
    ended = job(ctx, job_id)
    assert (ended.state, ended.crashes, ended.attempts) == (JobState.FAILED, 0, 1), ended.error
    assert ended.error is not None and ended.error.startswith(
        "stopped: its GPUs were idle for 1h5m on each of its 2 "
    ), ended.error


def test_a_crash_is_read_as_the_stop_every_rank_was_asked_where_two_hold_at_once(
    ctx: Context, channel_to: Opener, add_host: Callable[..., None]
) -> None:
    """A job over several hosts whose GPUs were idle past the lab's stop time and which the
    scheduler asked to make room: its ranks are asked the preemption (it comes before the
    idle stop), so a crash it ends with then is that preemption too, queued again for its
    reason with no crash counted, not failed as idle."""
    ctx.settings.gpu_idle_stop_s = 3600
    idle = datetime.now(UTC) - timedelta(minutes=70)
    add_host("lab-b", 1)
    job_id = dispatched(ctx, gpus=None, gpu_count=2, max_attempts=1)  # a GPU on each of lab-a and lab-b
    channel = channel_to(job_id, 1)
    channel.running(4321, "0", "/artifacts/1")
    for rank in (0, 1):
        use = {"rank": rank, "gpus": 1, "samples": 5, "busy_pct": 1.0, "idle_stop_since": idle}
        channel.report(Report([], [], {"gpu_use": use}, 0))
    assert channel.status().stop == "gpu_idle"
    set_job(ctx, job_id, preempt_requested_at=datetime.now(UTC), stop_reason="stopped to make room for job 812")
    status = channel.status()
    assert (status.stop, status.reason) == ("preempt", "stopped to make room for job 812"), status
    channel.end(AttemptEnd("queued", "lab-b: exit code 1", exit_code=1, crashed=True))
    again = job(ctx, job_id)
    assert (again.state, again.attempts, again.crashes) == (JobState.QUEUED, 2, 0), again.error


def test_a_crash_that_ends_an_attempt_asked_to_make_room_or_stopped_by_its_sweep_is_that_stop(
    ctx: Context, channel_to: Opener, add_host: Callable[..., None]
) -> None:
    """A job over several hosts asked to make room: rank 0's program may see rank 1's stop
    and exit first, before its own worker reads the preemption, and rank 0 then ends the
    attempt with a crash. The job is queued again for the preemption's reason, no crash
    counted against its `max_attempts`; the same crash unasked counts. A setting its
    adaptive sweep stopped and that ends so succeeds, with the sweep's reason."""
    add_host("lab-b", 1)
    job_id = dispatched(ctx, gpus=None, gpu_count=2, max_attempts=1)  # a GPU on each of lab-a and lab-b
    channel = channel_to(job_id, 1)
    channel.running(4321, "0", "/artifacts/1")
    set_job(ctx, job_id, preempt_requested_at=datetime.now(UTC), stop_reason="stopped to make room for job 812")
    assert channel.status().stop == "preempt"
    channel.end(AttemptEnd("queued", "the program exited with code 1", exit_code=1, crashed=True))
    again = job(ctx, job_id)
    assert (again.state, again.attempts, again.crashes) == (JobState.QUEUED, 2, 0), again.error
    assert (again.preempt_requested_at, again.stop_reason) == (None, None)
    with ctx.db.read() as session:
        said = session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id).order_by(JobEvent.id)).all()
    assert said[-1] == "stopped to make room for job 812", said

    LiveScheduler(ctx).run_pass()
    channel = channel_to(job_id, 2)
    channel.running(4321, "0", "/artifacts/1")
    channel.end(AttemptEnd("queued", "the program exited with code 1", exit_code=1, crashed=True))
    lost = job(ctx, job_id)
    assert (lost.state, lost.crashes) == (JobState.FAILED, 1), "unasked, a crash counts: 1 of its max_attempts 1"

    # a setting an adaptive sweep stopped (a cancel that says so) ends succeeded, as its worker records it
    behind = dispatched(ctx, gpus=None, gpu_count=2, max_attempts=1)
    channel = channel_to(behind, 1)
    channel.running(4321, "0", "/artifacts/1")
    said = f"{STOPPED_EARLY} at step 300: eval_loss 2.1, behind the rung's best"
    set_job(ctx, behind, cancel_requested_at=datetime.now(UTC), stop_reason=said)
    assert channel.status().stop == "sweep"
    channel.end(AttemptEnd("queued", "the program exited with code 1", exit_code=1, crashed=True))
    ended = job(ctx, behind)
    assert (ended.state, ended.crashes, ended.error) == (JobState.SUCCEEDED, 0, None)
    with ctx.db.read() as session:
        last = session.scalars(select(JobEvent.message).where(JobEvent.job_id == behind).order_by(JobEvent.id)).all()
    assert last[-1] == said, last


def test_every_rank_is_asked_to_stop_at_the_time_limit_and_a_crash_then_is_the_limit(
    ctx: Context, channel_to: Opener, add_host: Callable[..., None]
) -> None:
    """A job's time limit counts from its attempt's `running` event, the same for every rank:
    once it has passed, the attempt is asked to stop (`time_limit`, each rank). A crash it
    ends with then is the limit (a rank's program saw another's stop first), the job failed so
    and no crash counted; a crash before the limit is a crash; a cancel asked comes first."""
    add_host("lab-b", 1)
    job_id = dispatched(ctx, gpus=None, gpu_count=2, time_limit_s=60)  # a GPU on each of lab-a and lab-b
    channel = channel_to(job_id, 1)
    assert channel.status().stop is None, "dispatched: not started yet"
    channel.running(4321, "0", "/artifacts/1")
    assert channel.status().stop is None

    def started_ago(seconds: float) -> None:
        with ctx.db.write() as session:
            session.execute(
                update(JobEvent)
                .where(JobEvent.job_id == job_id, JobEvent.state == JobState.RUNNING)
                .values(time=datetime.now(UTC) - timedelta(seconds=seconds))
            )

    started_ago(50)
    assert channel.status().stop is None
    channel.end(AttemptEnd("queued", "lab-b: the program exited with code 1", exit_code=1, crashed=True))
    again = job(ctx, job_id)
    assert (again.state, again.crashes, again.attempts) == (JobState.QUEUED, 1, 2), "before its limit a crash is one"

    LiveScheduler(ctx).run_pass()
    channel = channel_to(job_id, 2)
    channel.running(4321, "0", "/artifacts/1")
    set_job(ctx, job_id, step=12)
    started_ago(61)
    status = channel.status()
    assert (status.stop, status.reason) == ("time_limit", "time limit of 1m reached"), status
    set_job(ctx, job_id, cancel_requested_at=datetime.now(UTC))
    assert channel.status().stop == "cancel"
    set_job(ctx, job_id, cancel_requested_at=None)
    channel.end(AttemptEnd("queued", "the program exited with code 1", exit_code=1, crashed=True))
    ended = job(ctx, job_id)
    assert (ended.state, ended.crashes, ended.attempts) == (JobState.FAILED, 1, 2), ended.error
    assert ended.error == "time limit of 1m reached at step 12"


def test_what_rank_0_held_when_the_job_moved_on_is_stored_until_a_later_attempt_starts(
    ctx: Context, channel_to: Opener
) -> None:
    """Another rank's crash moves the job on while rank 0's worker still holds points its
    program trained (its next flush was due a moment later): sent as `held`, they are the
    job's while it waits for its next attempt, which forgets those past its checkpoint when
    it starts. Once that attempt holds GPUs, they are refused: it trains and reports its own.
    Over HTTP the attempt's token ended with it, and nothing is taken."""
    job_id = dispatched(ctx)
    channel = channel_to(job_id, 1)
    channel.running(4321, "0", "/artifacts/1")
    channel.report(Report([point(job_id, 1)], [], {"step": 1}, 0))
    with ctx.db.write() as session:
        requeue(session, locked_job(session, job_id), "rank 2 on lab-b crashed", crashed=True)
    held = Report([point(job_id, step) for step in (2, 3)], [line(job_id, "held")], {"step": 3}, 70, held=True)
    with pytest.raises(StaleAttempt):  # not held: refused as before
        channel.report(Report([point(job_id, 4)], [], {"step": 4}, 0))
    if isinstance(channel, HttpChannel):
        with pytest.raises(StaleAttempt):
            channel.report(held)
        return
    channel.report(held)
    assert steps_of(ctx, job_id) == [1, 2, 3]
    assert (job(ctx, job_id).state, job(ctx, job_id).step, job(ctx, job_id).metric_points) == ("queued", 3, 3)

    LiveScheduler(ctx).run_pass()  # attempt 2 is given the GPU
    assert (job(ctx, job_id).state, job(ctx, job_id).attempts) == ("dispatched", 2)
    with pytest.raises(StaleAttempt):
        channel.report(Report([point(job_id, 5)], [], {"step": 5}, 0, held=True))
    assert steps_of(ctx, job_id) == [1, 2, 3] and job(ctx, job_id).step == 3


def test_what_rank_0_held_when_its_job_ended_is_stored(ctx: Context) -> None:
    """The job ended with the attempt (another rank's failure): what rank 0 held is its last
    attempt's, and kept; the attempt's end is not undone by it."""
    job_id = dispatched(ctx)
    channel = LocalChannel(ctx, job_id, 1)
    channel.running(4321, "0", "/artifacts/1")
    LocalChannel(ctx, job_id, 1).end(AttemptEnd("failed", "rank 1 on lab-b: it broke", exit_code=1))
    channel.report(Report([point(job_id, 7)], [], {"step": 7}, 0, held=True))
    assert steps_of(ctx, job_id) == [7]
    assert (job(ctx, job_id).state, job(ctx, job_id).step) == ("failed", 7)


def steps_of(ctx: Context, job_id: int) -> list[int]:
    with ctx.db.read() as session:
        return list(session.scalars(select(Metric.step).where(Metric.job_id == job_id).order_by(Metric.step)))


def test_an_attempt_out_of_memory_on_a_shared_gpu_is_queued_for_whole_gpus(ctx: Context, channel_to: Opener) -> None:
    job_id = dispatched(ctx, gpu_memory_fraction=0.5)
    channel = channel_to(job_id, 1)
    channel.running(4321, "0", "/artifacts/1")
    channel.end(AttemptEnd("queued", "ran out of GPU memory on a shared GPU", out_of_memory=True))
    again = job(ctx, job_id)
    assert (again.state, again.attempts, again.crashes, again.gpu_memory_fraction) == (JobState.QUEUED, 2, 0, 1.0)
    assert channel.status() == AttemptStatus(current=False)
    assert channel_to(job_id, 2).status() == AttemptStatus(current=False), "queued holds no GPUs"


def test_live_copies_reach_the_jobs_channel(ctx: Context, channel_to: Opener) -> None:
    job_id = dispatched(ctx)
    channel = channel_to(job_id, 1)
    said = encode(LogMessage(job_id=job_id, attempt=1, level="info", message="live", time=datetime.now(UTC)))
    with ctx.redis.pubsub() as pubsub:
        pubsub.subscribe(keys.job_channel(job_id))
        pubsub.get_message(timeout=1)  # the subscription's own
        channel.publish([said, said])
        got, deadline = [], time.monotonic() + 10
        while time.monotonic() < deadline and len(got) < 2:
            message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                got.append(message["data"].decode())
    assert got == [said, said]
    if isinstance(channel, HttpChannel):
        channel.close()  # its sender thread ends


def test_a_report_sent_again_after_a_lost_answer_is_stored_once(ctx: Context, settings: Settings) -> None:
    """Over HTTP a report whose answer was lost (the API restarted under it) is sent again:
    its number says it was stored, and its lines are not stored twice. `running` twice is
    taken too."""
    job_id = dispatched(ctx)
    with ctx.db.write() as session:
        token = mint_attempt_token(session, job_id, 1)
    headers = {"Authorization": f"Bearer {token}"}
    base = f"/api/attempts/{job_id}/1"
    started = {"pid": 4321, "cuda_visible_devices": "0", "artifacts_dir": "/a"}
    report = {"number": 1, "logs": [{"time": datetime.now(UTC).isoformat(), "level": "info", "message": "once"}]}
    with TestClient(create_app(settings)) as client:
        for _ in range(2):
            assert client.post(f"{base}/running", json=started, headers=headers).status_code == 204
            assert client.post(f"{base}/reports", json={**report, "log_bytes": 68}, headers=headers).status_code == 204
        assert client.post(f"{base}/running", json={**started, "pid": 99}, headers=headers).status_code == 409
        assert client.post(f"{base}/reports", json={**report, "number": 2}, headers=headers).status_code == 204
    with ctx.db.read() as session:
        messages = session.scalars(select(LogLine.message).where(LogLine.job_id == job_id)).all()
    assert messages == ["once", "once"], "the resend of 1 once, and 2"
    assert job(ctx, job_id).log_bytes == 68


def test_a_claim_waits_while_slurm_cannot_be_asked_where_the_attempt_runs(
    ctx: Context, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the Slurm executor the API takes a claim only of the node `squeue` names; while
    Slurm cannot be asked (here a real `squeue` whose controller does not answer) it answers 503, and
    the node's channel asks again until its patience ends. Nothing is recorded meanwhile."""
    if shutil.which("squeue") is None:
        pytest.skip("Slurm's client commands are not installed")
    conf = tmp_path / "slurm.conf"  # a cluster whose controller does not answer
    conf.write_text("ClusterName=gone\nSlurmctldHost=gone(127.0.0.1)\nSlurmctldPort=1\nMessageTimeout=1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    job_id = dispatched(ctx)
    with ctx.db.write() as session:
        token = mint_attempt_token(session, job_id, 1)
    asked: list[int] = []

    class Counting(TestClient):
        def request(self, *args: Any, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
            answer = super().request(*args, **kwargs)
            asked.append(answer.status_code)
            return answer

    with Counting(create_app(settings.model_copy(update={"executor": "slurm"}))) as client:
        answer = client.post(
            f"/api/attempts/{job_id}/1/claim", json={"node": "n1"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
        assert answer.json()["detail"].startswith("Slurm cannot be asked where the attempt runs: squeue: "), answer.text
        channel = HttpChannel("http://testserver", token, job_id, 1, http=client, retry_for=1.5)
        with pytest.raises(Refused, match="^Slurm cannot be asked where the attempt runs: squeue: ") as refused:
            channel.claim("n1")
        assert refused.value.passing
    assert asked[1:] == [503] * len(asked[1:]) and len(asked) >= 4, asked
    assert (job(ctx, job_id).state, job(ctx, job_id).host_name) == (JobState.DISPATCHED, "lab-a"), "not n1"


def test_a_door_waits_while_slurm_cannot_say_where_its_node_is_reached(
    ctx: Context, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the Slurm executor the API's proxy reaches a session's door at its node's address
    as Slurm says it (`NodeAddr`: a cluster's node names may resolve nowhere but in Slurm);
    while Slurm cannot be asked the door's record answers 503, the node's channel asks again
    until its patience ends, and nothing is recorded meanwhile."""
    if shutil.which("sinfo") is None:
        pytest.skip("Slurm's client commands are not installed")
    conf = tmp_path / "slurm.conf"  # a cluster whose controller does not answer
    conf.write_text("ClusterName=gone\nSlurmctldHost=gone(127.0.0.1)\nSlurmctldPort=1\nMessageTimeout=1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    job_id = dispatched(ctx, {"kind": "notebook", "gpus": [0]})
    with ctx.db.write() as session:
        token = mint_attempt_token(session, job_id, 1)
    port = ctx.settings.rank_port_range[0]
    with TestClient(create_app(settings.model_copy(update={"executor": "slurm"}))) as client:
        answer = client.post(
            f"/api/attempts/{job_id}/1/door",
            json={"address": f"lab-a:{port}", "key": "cd" * 32},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
        assert answer.json()["detail"].startswith("Slurm cannot be asked where lab-a is reached: sinfo: "), answer.text
        channel = HttpChannel("http://testserver", token, job_id, 1, http=client, retry_for=1.0)
        with pytest.raises(Refused, match="^Slurm cannot be asked where lab-a is reached") as refused:
            channel.open_door(f"lab-a:{port}", "cd" * 32)
        assert refused.value.passing
    with ctx.db.read() as session:
        assert session.scalars(select(RankAddress.address)).all() == []


def test_a_nodes_address_is_slurms_word_or_its_name() -> None:
    said = "n1|10.0.0.5\nn1|10.0.0.5\n"  # a line per partition the node is in
    assert parse_address(said, "n1") == "10.0.0.5"
    assert parse_address("n1|fe80::1\n", "n1") == "fe80::1"
    assert (
        parse_address(said, "n2") is None and parse_address("", "n1") is None and parse_address("n1|\n", "n1") is None
    )
    assert address_command("n1") == ["sinfo", "--Node", "--noheader", "--nodes=n1", "--format=%N|%o"]


def test_what_became_of_a_job_since_an_attempt_decides_the_image_it_left(ctx: Context) -> None:
    """`worker.disk.settle`: an image an attempt left stays for the job's next attempt while
    it waits, comes back once it ends, and is dropped once a later attempt has run."""
    job_id = dispatched(ctx)
    LocalChannel(ctx, job_id, 1).running(4321, "0", "/artifacts/1")
    fate = fate_of_attempts(ctx)
    assert fate(job_id, 1) == "waits", "its own attempt is running (its worker died: it is requeued soon)"
    with ctx.db.write() as session:
        requeue(session, locked_job(session, job_id), "the worker on lab-a restarted", crashed=True)
    assert fate(job_id, 1) == "waits", "attempt 2 waits in the queue: it will resume from attempt 1's folder"
    LiveScheduler(ctx).run_pass()
    assert fate(job_id, 1) == "waits", "dispatched, not yet running"
    LocalChannel(ctx, job_id, 2).running(4322, "0", "/artifacts/1")
    assert fate(job_id, 1) == "superseded" and fate(job_id, 2) == "waits" and fate(job_id + 1, 1) == "ended"
    LocalChannel(ctx, job_id, 2).end(AttemptEnd(ending="succeeded", message=None, exit_code=0))
    assert fate(job_id, 2) == "ended"
