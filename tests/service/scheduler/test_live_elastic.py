"""Elastic jobs in the live pass (issue 47), against a real database and Redis: an elastic
job starts on what is free, shrinks for a waiting job and grows onto idle GPUs by a stop
at a checkpoint and a start on its new GPUs, which the pass gives it before anyone else."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sqlalchemy import select

from service.core import keys
from service.core.attempts import forget_after
from service.core.context import Context
from service.core.lifecycle import finish, locked_job, mark_running, requeue
from service.core.models import Allocation, Gpu, Job, JobEvent, JobState
from service.jobs.read import job_detail
from service.lab.auth import Caller
from service.scheduler.costs import MIN_RUN_S
from service.scheduler.dryrun import estimate
from service.scheduler.live import LiveScheduler
from service.scheduler.resize import read_targets
from service.scheduler.settle import place_resized
from service.scheduler.snapshot import read_cluster, read_queued
from tests.service.scheduler.test_live import backdate_allocations, job_row, over_committed, submit_job
from towerq.contract.spec import JobSpec

ONE_GPU = {"model": "mlp", "dataset": "digits", "gpu_count": 1}


def held(ctx: Context, job_id: int) -> list[int]:
    """The GPU indices the job's current attempt holds."""
    with ctx.db.read() as session:
        rows = session.scalars(
            select(Gpu.index)
            .join(Allocation, Allocation.gpu_id == Gpu.id)
            .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))
        )
        return sorted(rows)


def running(ctx: Context, job_id: int, attempt: int = 1) -> None:
    with ctx.db.write() as session:
        mark_running(session, job_id, attempt, {"pid": 1})


def stopped_at_its_checkpoint(ctx: Context, job_id: int) -> None:
    """What its worker records once the attempt asked to stop has checkpointed and exited."""
    with ctx.db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.stop_reason is not None
        requeue(session, job, job.stop_reason, crashed=False)


def messages(ctx: Context, job_id: int) -> list[str]:
    with ctx.db.read() as session:
        return list(session.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


def started_beside_a_rigid_job(ctx: Context, caller: Callable[[str], Caller]) -> tuple[int, int]:
    """On a 4-GPU lab-a: alice's rigid job on GPUs 0,1 and bob's elastic one (4 GPUs, at
    least 1) started small on 2,3, both running."""
    rigid = submit_job(ctx, caller("alice"), gpu_count=2)
    LiveScheduler(ctx).run_pass()
    elastic = submit_job(ctx, caller("bob"), gpu_count=4, min_gpu_count=1)
    LiveScheduler(ctx).run_pass()
    assert held(ctx, elastic) == [2, 3]
    running(ctx, rigid)
    running(ctx, elastic)
    return rigid, elastic


def test_an_elastic_job_starts_on_the_gpus_that_are_free(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    rigid = submit_job(ctx, caller("alice"), gpu_count=3)
    LiveScheduler(ctx).run_pass()
    elastic = submit_job(ctx, caller("bob"), gpu_count=4, min_gpu_count=2)
    one = submit_job(ctx, caller("bob"), gpu_count=4, min_gpu_count=1)
    LiveScheduler(ctx).run_pass()
    assert held(ctx, rigid) == [0, 1, 2]
    assert job_row(ctx, elastic).state == JobState.QUEUED, "1 GPU is free: below its minimum of 2"
    assert held(ctx, one) == [3]
    assert messages(ctx, one)[-1] == "GPU 3 on lab-a (1 of 4 GPUs, elastic)"


def test_an_elastic_job_shrinks_for_a_waiting_job_and_restarts_on_the_gpus_it_kept(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    elastic = submit_job(ctx, caller("bob"), gpu_count=4, min_gpu_count=1)
    LiveScheduler(ctx).run_pass()
    assert job_row(ctx, elastic).run_served_gpu_s == 0.0, "its run begins"
    running(ctx, elastic)
    waiting = submit_job(ctx, caller("alice"), gpu_count=2)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [], "not before it ran MIN_RUN_S: a restart must pay"
    assert job_row(ctx, waiting).pending_reason == f"waiting for 2 free GPUs on lab-a (job {elastic})"

    backdate_allocations(ctx, elastic, MIN_RUN_S + 60)
    pubsub = ctx.redis.pubsub()
    pubsub.subscribe(keys.host_control_channel("lab-a"))
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [elastic] and report.placed == []
    job = job_row(ctx, elastic)
    assert job.stop_reason == (
        f"shrinking to 2 of 4 GPUs for job {waiting}: it restarts on GPUs 0,1 of lab-a from its checkpoint"
    )
    assert job.resize_to == {"host": "lab-a", "gpus": [0, 1], "for": waiting, "from": "lab-a"}
    control = [
        json.loads(m["data"]) for m in (pubsub.get_message(timeout=1) for _ in range(3)) if m and m["type"] == "message"
    ]
    assert [(c["type"], c["job_id"]) for c in control] == [("preempt", elastic)]
    assert held(ctx, elastic) == [0, 1, 2, 3], "it holds its GPUs until its checkpoint is written"

    report = LiveScheduler(ctx).run_pass()  # while it stops: the waiting job is told, and nothing else moves
    assert report is not None and (report.resized, report.placed, report.preempted) == ([], [], [])
    assert job_row(ctx, waiting).pending_reason == (
        f"shrinking elastic job {elastic} on lab-a to make room (each restarts from its checkpoint on fewer GPUs)"
    )

    stopped_at_its_checkpoint(ctx, elastic)
    with ctx.db.read() as session:
        queued, _ = read_queued(session)
        cluster, _ = read_cluster(session)
        targets = read_targets(session)
    place_resized(queued, cluster, targets, time.time())
    (again,) = [r for r in cluster.running if r.id == elastic]
    assert (again.indices, again.run_served_gpu_s) == ((0, 1), 0.0) and again.served_gpu_s > 0, (
        "the pass sees the resized job go on with its run"
    )
    late = submit_job(ctx, caller("carol"), gpu_count=2)  # came after: it does not take the kept GPUs
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and sorted(p[0] for p in report.placed) == sorted([elastic, waiting])
    assert (held(ctx, elastic), held(ctx, waiting)) == ([0, 1], [2, 3])
    assert job_row(ctx, late).state == JobState.QUEUED
    job = job_row(ctx, elastic)
    assert (job.attempts, job.crashes, job.resize_to, job.run_served_gpu_s) == (2, 0, None, 0.0)
    with ctx.db.read() as session:
        (part,) = [r for r in read_cluster(session)[0].running if r.id == elastic]
    assert part.served_gpu_s >= 4 * (MIN_RUN_S + 60) and part.run_served_gpu_s == 0.0, (
        "the resize goes on with its run: time slicing counts the run from its first start (sliceable_from)"
    )
    assert messages(ctx, elastic)[-2:] == [
        f"shrinking to 2 of 4 GPUs for job {waiting}: it restarts on GPUs 0,1 of lab-a from its checkpoint",
        "GPUs 0,1 on lab-a (2 of 4 GPUs, elastic)",
    ]
    assert over_committed(ctx) == {}

    running(ctx, elastic, attempt=2)
    with ctx.db.write() as session:
        forget_after(session, elastic, 2, 1200)  # its trainer resumed from the checkpoint of step 1200
        detail = job_detail(session, locked_job(session, elastic))
    over_time = detail.held
    assert detail.allocation is not None and (detail.allocation.host, detail.allocation.gpus) == ("lab-a", [0, 1])
    assert [(h.attempt, h.host, h.gpus, h.from_step, h.until is None) for h in over_time] == [
        (1, "lab-a", 4, 0, False),
        (2, "lab-a", 2, 1200, True),
    ], "the job page's GPUs held over time, and where its charts mark the resize"


def test_the_free_gpus_a_shrink_makes_room_beside_are_held_while_it_stops(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    rigid, elastic = started_beside_a_rigid_job(ctx, caller)
    backdate_allocations(ctx, elastic, MIN_RUN_S + 60)
    with ctx.db.write() as session:
        finish(session, rigid, 1, JobState.SUCCEEDED)
    waiting = submit_job(ctx, caller("alice"), gpu_count=3)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [elastic] and report.placed == []
    assert job_row(ctx, elastic).resize_to == {"host": "lab-a", "gpus": [2], "for": waiting, "from": "lab-a"}

    with ctx.db.read() as session:  # a dry run sees what the pass holds
        guess = estimate(session, ctx.settings, "carol", JobSpec.model_validate(ONE_GPU), None)
    assert not guess.starts_now and guess.reason == f"GPU 0 on lab-a held for job {waiting}, next to start there"
    late = submit_job(ctx, caller("carol"), gpu_count=1)  # came while it stops: GPUs 0,1 are the waiting job's
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and (report.resized, report.placed, report.preempted) == ([], [], [])
    assert job_row(ctx, late).pending_reason == f"GPU 0 on lab-a held for job {waiting}, next to start there"
    # Expected starts see it too: the waiting job's once the shrink has checkpointed; a job that
    # came since, once a job ends (the elastic one restarts on GPU 2), not "now" on a held GPU.
    expected = job_row(ctx, waiting).expected_start_at
    assert expected is not None and guess.expected_start_at is not None
    assert guess.expected_start_at.replace(tzinfo=None) > expected.replace(tzinfo=None)
    assert (job_row(ctx, late).expected_start_at or expected) > expected
    stopped_at_its_checkpoint(ctx, elastic)
    LiveScheduler(ctx).run_pass()
    assert (held(ctx, elastic), held(ctx, waiting), held(ctx, late)) == ([2], [0, 1, 3], [])
    assert over_committed(ctx) == {}


def test_an_elastic_job_grows_onto_idle_gpus_and_starts_on_those_still_free(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    rigid, elastic = started_beside_a_rigid_job(ctx, caller)
    with ctx.db.write() as session:
        finish(session, rigid, 1, JobState.SUCCEEDED)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [], "not before it ran MIN_RUN_S"

    backdate_allocations(ctx, elastic, MIN_RUN_S + 60)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [elastic]
    job = job_row(ctx, elastic)
    assert job.stop_reason == (
        "growing to 4 of 4 GPUs (idle ones): it restarts on GPUs 0,1,2,3 of lab-a from its checkpoint"
    )
    assert LiveScheduler(ctx).run_pass().resized == []  # type: ignore[union-attr]  # asked once

    one = submit_job(ctx, caller("carol"), gpu_count=1)  # takes an idle GPU while the job stops
    LiveScheduler(ctx).run_pass()
    assert held(ctx, one) == [0], "idle GPUs no one waited for: a growth on its own host holds none"
    stopped_at_its_checkpoint(ctx, elastic)
    LiveScheduler(ctx).run_pass()
    assert held(ctx, elastic) == [1, 2, 3]
    assert messages(ctx, elastic)[-1] == "GPUs 1,2,3 on lab-a (3 of 4 GPUs, elastic)"
    assert over_committed(ctx) == {}


def test_an_elastic_job_moves_to_another_host_to_free_its_own_for_a_whole_host_job(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    add_host("lab-b", 4)
    elastic = submit_job(ctx, caller("bob"), gpu_count=2, min_gpu_count=1)
    rigid = submit_job(ctx, caller("carol"), gpu_count=2, host="lab-b")
    LiveScheduler(ctx).run_pass()
    assert (held(ctx, elastic), held(ctx, rigid)) == ([0, 1], [0, 1])
    running(ctx, elastic)
    running(ctx, rigid)
    backdate_allocations(ctx, elastic, MIN_RUN_S + 60)
    whole = submit_job(ctx, caller("alice"), gpu_count=4)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [elastic] and report.placed == [] and report.preempted == []
    job = job_row(ctx, elastic)
    assert job.stop_reason == (
        f"moving to GPUs 2,3 of lab-b to free lab-a for job {whole}: it restarts there from its checkpoint on "
        "as many GPUs"
    )
    assert job.resize_to == {"host": "lab-b", "gpus": [2, 3], "for": whole, "from": "lab-a"}

    two = submit_job(ctx, caller("dave"), gpu_count=2)  # came while it stops: lab-b's 2,3 are held for it
    report = LiveScheduler(ctx).run_pass()  # while it stops: the whole-host job is told, and nothing else moves
    assert report is not None and (report.resized, report.placed, report.preempted) == ([], [], [])
    assert job_row(ctx, whole).pending_reason == (
        f"moving elastic job {elastic} off lab-a to make room (each restarts from its checkpoint on another host)"
    )
    expected = {j: job_row(ctx, j).expected_start_at for j in (whole, two)}
    assert None not in expected.values() and expected[two] > expected[whole], "the moved job restarts on lab-b 2,3"
    stopped_at_its_checkpoint(ctx, elastic)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and sorted(p[0] for p in report.placed) == sorted([elastic, whole])
    assert (held(ctx, elastic), held(ctx, whole), held(ctx, two)) == ([2, 3], [0, 1, 2, 3], [])
    assert messages(ctx, elastic)[-1] == "GPUs 2,3 on lab-b", "at its full size"
    assert over_committed(ctx) == {}


def test_a_job_over_two_hosts_keeps_the_host_freed_first_while_the_other_move_stops(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    for name in ("lab-a", "lab-b", "lab-c", "lab-d"):
        add_host(name, 4)
    fillers = [
        submit_job(ctx, caller("carol"), gpu_count=n, host=host)
        for n, host in ((4, "lab-a"), (4, "lab-b"), (2, "lab-c"))
    ]
    LiveScheduler(ctx).run_pass()
    first, second = (submit_job(ctx, caller("bob"), gpu_count=2, min_gpu_count=1) for _ in range(2))
    LiveScheduler(ctx).run_pass()
    assert (held(ctx, first), held(ctx, second)) == ([2, 3], [0, 1]), "lab-c's free pair, then lab-d's"
    with ctx.db.write() as session:
        for job_id in fillers:
            finish(session, job_id, 1, JobState.SUCCEEDED)
    rigid = [submit_job(ctx, caller("carol"), gpu_count=2, host=host) for host in ("lab-a", "lab-b")]
    LiveScheduler(ctx).run_pass()
    for job_id in (first, second, *rigid):
        running(ctx, job_id)
    backdate_allocations(ctx, first, MIN_RUN_S + 60)
    backdate_allocations(ctx, second, MIN_RUN_S + 60)
    whole = submit_job(ctx, caller("alice"), gpu_count=8)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and sorted(report.resized) == sorted([first, second]) and report.placed == []
    assert [job_row(ctx, j).resize_to["from"] for j in (first, second)] == ["lab-c", "lab-d"]  # type: ignore[index]

    stopped_at_its_checkpoint(ctx, first)  # its move ends first: it restarts on lab-a, lab-c is free
    LiveScheduler(ctx).run_pass()
    assert held(ctx, first) == [2, 3]
    late = submit_job(ctx, caller("dave"), gpu_count=2)  # lab-c is whole and free: the whole-host job's
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.placed == [] and held(ctx, late) == []
    stopped_at_its_checkpoint(ctx, second)
    LiveScheduler(ctx).run_pass()
    assert held(ctx, whole) == [0, 0, 1, 1, 2, 2, 3, 3] and held(ctx, late) == [], "lab-c and lab-d"
    assert over_committed(ctx) == {}


def test_an_elastic_job_on_the_host_it_asked_for_is_never_moved_off_it(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    add_host("lab-b", 4)
    pinned = submit_job(ctx, caller("bob"), gpu_count=2, min_gpu_count=1, host="lab-a")
    rigid = submit_job(ctx, caller("carol"), gpu_count=2, host="lab-b")
    LiveScheduler(ctx).run_pass()
    running(ctx, pinned)
    running(ctx, rigid)
    backdate_allocations(ctx, pinned, MIN_RUN_S + 60)
    whole = submit_job(ctx, caller("alice"), gpu_count=4)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [] and job_row(ctx, whole).state == JobState.QUEUED


def test_an_elastic_job_on_the_host_it_asked_for_grows_only_there(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    add_host("lab-b", 4)
    rigid = submit_job(ctx, caller("carol"), gpu_count=2, host="lab-a")
    LiveScheduler(ctx).run_pass()
    pinned = submit_job(ctx, caller("bob"), gpu_count=4, min_gpu_count=1, host="lab-a")
    LiveScheduler(ctx).run_pass()
    assert held(ctx, pinned) == [2, 3], "it started small on the host it asked for"
    running(ctx, rigid)
    running(ctx, pinned)
    backdate_allocations(ctx, pinned, MIN_RUN_S + 60)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and report.resized == [], "lab-b's 4 idle GPUs are not its host's"


def test_a_rigid_job_is_never_resized(
    ctx: Context, caller: Callable[[str], Caller], add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 4)
    rigid = submit_job(ctx, caller("bob"), gpu_count=4)
    LiveScheduler(ctx).run_pass()
    running(ctx, rigid)
    backdate_allocations(ctx, rigid, MIN_RUN_S + 60)  # as long as the elastic job above had run
    waiting = submit_job(ctx, caller("alice"), gpu_count=2)
    report = LiveScheduler(ctx).run_pass()
    assert report is not None and (report.resized, report.preempted) == ([], [])
    assert job_row(ctx, waiting).pending_reason == f"waiting for 2 free GPUs on lab-a (job {rigid})"
