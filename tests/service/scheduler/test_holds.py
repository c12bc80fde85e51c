"""A queued job put on hold and released (as Slurm's `scontrol hold` and `release`), against
the live pass and a real database (SQLite and PostgreSQL): on hold it waits, saying who
holds it, and others start past it; released it starts, as if it had waited only while it
was not on hold; a member cannot undo an admin's hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from service.core.context import Context
from service.core.exceptions import ForbiddenError, StateConflictError
from service.core.lifecycle import finish, locked_job, requeue
from service.core.models import Allocation, Job, JobEvent, JobState, utcnow
from service.executors import LocalExecutor
from service.jobs.change import JobChange, change_job
from service.jobs.holds import hold_job, release_job
from service.lab.accounting import timeline, usage_report
from service.lab.auth import Caller
from service.notifications.prometheus import _waits
from service.scheduler.dryrun import estimate
from service.scheduler.handover import write_said
from service.scheduler.live import LiveScheduler
from tests.service.scheduler.test_live import job_row, submit_job
from towerq.contract.spec import JobSpec

JOB = {"model": "mlp", "dataset": "digits"}


def hold(ctx: Context, job_id: int, who: Caller) -> None:
    with ctx.db.write() as session:
        hold_job(session, job_id, who)


def release(ctx: Context, job_id: int, who: Caller) -> None:
    with ctx.db.write() as session:
        release_job(session, job_id, who)


def said(ctx: Context, job_id: int) -> list[str | None]:
    """The job's history, its events' messages in order."""
    with ctx.db.read() as session:
        return list(session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


def test_a_job_on_hold_waits_saying_who_holds_it_and_starts_once_released(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 1)
    alice = caller("alice")
    first = submit_job(ctx, alice)
    hold(ctx, first, alice)
    second = submit_job(ctx, alice)
    scheduler = LiveScheduler(ctx)
    report = scheduler.run_pass()
    assert report is not None and [p[0] for p in report.placed] == [second]  # past the held one
    held = job_row(ctx, first)
    assert (held.state, held.queue_position, held.on_hold_by) == (JobState.QUEUED, None, "alice")
    assert held.reason == f"on hold (alice): towerq release {first} lets it start"
    assert said(ctx, first)[-1] == "put on hold by alice"

    release(ctx, first, alice)
    with ctx.db.write() as session:
        finish(session, second, 1, JobState.SUCCEEDED)
    report = scheduler.run_pass()
    assert report is not None and [p[0] for p in report.placed] == [first]
    started = job_row(ctx, first)
    assert started.on_hold_by is None and started.held_s > 0
    assert said(ctx, first)[-2:] == ["released by alice", "GPU 0 on lab-a"]


def test_time_on_hold_is_no_wait(ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]) -> None:
    """A job held for an hour and released comes after one submitted a minute after it: its
    hour on hold is not an hour of waiting (it would have come first)."""
    add_host("lab-a", 1)
    alice = caller("alice")
    blocker = submit_job(ctx, alice)
    LiveScheduler(ctx).run_pass()
    early, late = submit_job(ctx, alice), submit_job(ctx, alice)
    with ctx.db.write() as session:  # `early` was submitted two minutes before `late`
        session.execute(
            update(Job).where(Job.id == early).values(created_at=job_row(ctx, late).created_at - timedelta(minutes=2))
        )
    scheduler = LiveScheduler(ctx)
    scheduler.run_pass()
    assert [job_row(ctx, i).queue_position for i in (early, late)] == [1, 2]  # the control: first come

    hold(ctx, early, alice)
    with ctx.db.write() as session:  # held for an hour
        an_hour_ago = utcnow() - timedelta(hours=1)
        session.execute(update(Job).where(Job.id == early).values(on_hold_at=an_hour_ago))
    release(ctx, early, alice)
    assert 3600 <= job_row(ctx, early).held_s < 3660
    scheduler.pending_written_at = float("-inf")  # the next pass rewrites the queue
    scheduler.run_pass()
    assert [job_row(ctx, i).queue_position for i in (early, late)] == [2, 1]
    assert job_row(ctx, blocker).state == JobState.DISPATCHED


def test_who_may_hold_and_release_and_what(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 1)
    alice, bob = caller("alice"), caller("bob")
    root = replace(caller("root"), is_admin=True)
    running, queued = submit_job(ctx, alice), submit_job(ctx, alice)
    LiveScheduler(ctx).run_pass()
    with pytest.raises(ForbiddenError, match="belongs to alice; only they or an admin may hold it"):
        hold(ctx, queued, bob)
    with pytest.raises(StateConflictError, match=f"job {running} is dispatched: only a queued job is put on hold"):
        hold(ctx, running, alice)
    with pytest.raises(StateConflictError, match=f"job {queued} is not on hold"):
        release(ctx, queued, alice)

    hold(ctx, queued, alice)
    hold(ctx, queued, root)  # an admin's hold takes the owner's place ...
    assert job_row(ctx, queued).reason == "on hold by an admin (root): only an admin may release it"
    with pytest.raises(ForbiddenError, match="put on hold by root, an admin: only an admin may release it"):
        release(ctx, queued, alice)  # ... and the owner cannot undo it
    release(ctx, queued, root)
    assert job_row(ctx, queued).on_hold_by is None

    # A job on hold that can never start (a job it needs failed) is cancelled all the same.
    doomed = submit_job(ctx, alice, after=[running])
    hold(ctx, doomed, alice)
    with ctx.db.write() as session:
        finish(session, running, 1, JobState.FAILED, error="diverged")
    LiveScheduler(ctx).run_pass()
    ended = job_row(ctx, doomed)
    assert ended.state == JobState.CANCELLED and ended.on_hold_by is None, ended.reason
    with pytest.raises(StateConflictError, match=f"job {doomed} is not on hold: it is cancelled"):
        release(ctx, doomed, alice)


def test_a_job_submitted_on_hold_waits_from_the_start(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """`"hold": true` in the spec (`towerq submit --hold`, as `sbatch --hold`): queued on hold
    in the same write, so no pass can start it before a hold would land."""
    add_host("lab-a", 1)
    alice = caller("alice")
    held = submit_job(ctx, alice, hold=True)
    assert said(ctx, held) == ["submitted by alice, on hold"]
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.placed == []
    assert job_row(ctx, held).reason == f"on hold (alice): towerq release {held} lets it start"
    with ctx.db.read() as session:
        guess = estimate(session, ctx.settings, "alice", JobSpec.model_validate({**JOB, "hold": True}), None)
    assert (guess.starts_now, guess.reason) == (False, "on hold: it starts once released (towerq release ID)")
    release(ctx, held, alice)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and [p[0] for p in report.placed] == [held]


def test_the_wait_figures_leave_out_time_on_hold_before_the_first_start(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """A job submitted 62 minutes ago that spent an hour of it on hold waited two minutes:
    so say `towerq usage` (median and p95 wait), the usage page's queue samples and
    Prometheus' queue wait; a hold after its first start (requeued, on a later attempt) is
    no part of that wait. The scheduler's order leaves every hold out (`held_s`)."""
    add_host("lab-a", 1)
    alice = caller("alice")
    job_id = submit_job(ctx, alice)
    hold(ctx, job_id, alice)
    with ctx.db.write() as session:
        now = utcnow()
        values = {"created_at": now - timedelta(minutes=62), "on_hold_at": now - timedelta(hours=1)}
        session.execute(update(Job).where(Job.id == job_id).values(**values))
    release(ctx, job_id, alice)
    LiveScheduler(ctx).run_pass()
    assert job_row(ctx, job_id).state == JobState.DISPATCHED
    with ctx.db.read() as session:
        now = utcnow()
        [row] = usage_report(session, now - timedelta(days=1), now + timedelta(minutes=1), "user", now)
        samples = timeline(session, now - timedelta(hours=2), now, now)[1]  # the last sample at now
        waits = _waits(session, JobState.DISPATCHED)
    assert row.key == "alice" and row.median_wait_s is not None and row.p95_wait_s is not None
    assert 120 <= row.median_wait_s < 180 and 120 <= row.p95_wait_s < 180, row  # 3,720 s counted its hour on hold
    [sampled] = [s.median_wait_s for s in samples if s.started]
    assert sampled is not None and 120 <= sampled < 180
    assert len(waits) == 1 and 120 <= waits[0] < 180

    with ctx.db.write() as session:  # back in the queue, on its second attempt, and held again
        requeue(session, locked_job(session, job_id), "its host went down", crashed=True)
    hold(ctx, job_id, alice)
    with ctx.db.write() as session:
        session.execute(update(Job).where(Job.id == job_id).values(on_hold_at=utcnow() - timedelta(hours=1)))
    release(ctx, job_id, alice)
    job = job_row(ctx, job_id)
    assert 7200 <= job.held_s < 7260 and 3600 <= job.wait_held_s < 3660


def test_a_job_waits_for_its_begin_time_which_is_no_wait(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """`"begin_at"` (`towerq run --begin`, as `sbatch --begin`): the job is left out of every
    pass until then, its reason saying when; the time before it is no wait in the order and
    the wait figures; moved to now (`towerq update --begin now`) it starts; once it ran, its
    begin no longer changes. A hold before its begin adds nothing to that."""
    add_host("lab-a", 1)
    alice = caller("alice")
    later = (utcnow() + timedelta(hours=1)).isoformat()
    deferred = submit_job(ctx, alice, begin_at=later)
    plain = submit_job(ctx, alice)
    scheduler = LiveScheduler(ctx)
    report = scheduler.run_pass()
    assert report is not None and [p[0] for p in report.placed] == [plain]  # past the one not yet begun
    job = job_row(ctx, deferred)
    begins = job.begin_at
    assert begins is not None and job.state == JobState.QUEUED and job.queue_position is None
    assert job.reason == (
        f"not before {begins.astimezone().strftime('%H:%M')} (its begin time: towerq update {deferred} --begin now "
        "lets it start)"
    )
    assert 3590 <= job.held_s <= 3600 and job.wait_held_s == job.held_s  # an hour that is no wait
    with ctx.db.read() as session:
        guess = estimate(session, ctx.settings, "alice", JobSpec.model_validate({**JOB, "begin_at": later}), None)
    assert not guess.starts_now and guess.reason.startswith("not before "), guess

    hold(ctx, deferred, alice)  # a hold while its begin is ahead: that time is no wait already
    release(ctx, deferred, alice)
    assert job_row(ctx, deferred).held_s == job.held_s

    with ctx.db.write() as session:
        change_job(session, deferred, JobChange(begin_at=utcnow()), alice, ctx.settings, LocalExecutor(ctx.redis))
        finish(session, plain, 1, JobState.SUCCEEDED)
    job = job_row(ctx, deferred)
    assert job.held_s < 5 and job.wait_held_s == job.held_s  # it was no wait from its submit to now
    report = scheduler.run_pass()
    assert report is not None and [p[0] for p in report.placed] == [deferred]
    with ctx.db.write() as session, pytest.raises(StateConflictError, match="its begin changes only before it"):
        change_job(session, deferred, JobChange(begin_at=later), alice, ctx.settings, LocalExecutor(ctx.redis))


def test_a_job_with_its_begin_ahead_comes_after_those_that_waited_meanwhile(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """Its place in line counts from its begin, as Slurm's age counts from a job's eligible
    time: a job submitted two hours ago to begin an hour ago comes after one submitted 90
    minutes ago."""
    add_host("lab-a", 1)
    alice = caller("alice")
    blocker = submit_job(ctx, alice)
    LiveScheduler(ctx).run_pass()
    early = submit_job(ctx, alice, begin_at=(utcnow() + timedelta(hours=1)).isoformat())
    late = submit_job(ctx, alice)
    with ctx.db.write() as session:  # as if `early` came two hours ago, to begin an hour ago
        row = session.get(Job, early)
        assert row is not None and row.begin_at is not None
        row.created_at, row.begin_at = row.created_at - timedelta(hours=2), row.begin_at - timedelta(hours=2)
        session.execute(update(Job).where(Job.id == late).values(created_at=utcnow() - timedelta(minutes=90)))
    scheduler = LiveScheduler(ctx)
    scheduler.run_pass()
    assert [job_row(ctx, i).queue_position for i in (early, late)] == [2, 1]
    assert job_row(ctx, blocker).state == JobState.DISPATCHED


@pytest.mark.usefixtures("whole_replays")
def test_a_job_whose_begin_is_ahead_is_expected_at_its_begin_or_once_room_frees_after_it(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """The replay of expected starts has a job held back by its begin alone join the queue at
    its begin: on a GPU free then it is expected then; on one a job holds past its begin, once
    that job likely ends (its time limit). One on hold as well gets none, as any held job; a
    dry run says the same as the pass. Before, a job whose begin was ahead had no estimate."""
    add_host("lab-a", 1)
    alice = caller("alice")
    running = submit_job(ctx, alice, time_limit_s=1800)
    scheduler = LiveScheduler(ctx)
    scheduler.run_pass()
    soon = submit_job(ctx, alice, begin_at=(utcnow() + timedelta(minutes=10)).isoformat(), time_limit_s=600)
    late = submit_job(ctx, alice, begin_at=(utcnow() + timedelta(hours=2)).isoformat())
    held = submit_job(ctx, alice, begin_at=(utcnow() + timedelta(hours=2)).isoformat(), hold=True)
    scheduler.run_pass()
    with ctx.db.read() as session:
        allocated = session.scalar(select(func.min(Allocation.created_at)).where(Allocation.job_id == running))
    assert allocated is not None
    rows = {job_id: job_row(ctx, job_id) for job_id in (soon, late, held)}
    assert all((rows[i].reason or "").startswith("not before ") for i in (soon, late)), rows
    assert (rows[held].reason or "").startswith("on hold (alice)"), rows[held].reason
    expected = {job_id: (row.expected_start_at, row.expected_host) for job_id, row in rows.items()}
    assert expected[held] == (None, None), expected
    at, host = expected[soon]
    assert at is not None and host == "lab-a" and abs((at - allocated).total_seconds() - 1800) < 2, expected
    at, host = expected[late]
    begins = rows[late].begin_at
    assert at is not None and begins is not None and host == "lab-a", expected
    assert abs((at - begins).total_seconds()) < 2, (at, begins)

    later = (utcnow() + timedelta(hours=1)).isoformat()  # after `soon` ran its 10 minutes, before `late`
    with ctx.db.read() as session:
        guess = estimate(session, ctx.settings, "alice", JobSpec.model_validate({**JOB, "begin_at": later}), None)
    assert not guess.starts_now and guess.reason is not None and guess.reason.startswith("not before "), guess
    assert guess.expected_host == "lab-a" and guess.expected_start_at is not None, guess
    assert abs((guess.expected_start_at - datetime.fromisoformat(later)).total_seconds()) < 2, guess


def test_what_slurm_says_of_a_job_put_on_hold_meanwhile_leaves_its_hold_reason(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    """The hand-over pass reads the dispatched jobs, then asks Slurm of each: one put on hold
    in between (`scontrol hold` there, towerq's reason here) is said held by Slurm ("JobHeld…"),
    and that must not overwrite its reason, which says who holds it and how to release it: it
    did, until its release (tests/test_slurm.py's hold failed so in a clean run)."""
    add_host("lab-a", 2)
    alice = caller("alice")
    ids = [submit_job(ctx, alice) for _ in range(2)]
    LiveScheduler(ctx).run_pass()
    kept = f"on hold (alice): towerq release {ids[0]} lets it start"
    with ctx.db.write() as session:
        session.execute(
            update(Job).where(Job.id == ids[0]).values(on_hold_by="alice", on_hold_at=utcnow(), pending_reason=kept)
        )
    slurm = "Slurm job {} is pending (JobHeldAdmin: an admin holds it)"
    with ctx.db.write() as session:
        nothing = {"expected_start_at": None, "expected_host": None}
        write_said(session, [{"id": i, "pending_reason": slurm.format(i), **nothing} for i in ids])
    assert [job_row(ctx, i).state for i in ids] == [JobState.DISPATCHED] * 2
    assert job_row(ctx, ids[0]).pending_reason == kept
    assert job_row(ctx, ids[1]).pending_reason == slurm.format(ids[1])
