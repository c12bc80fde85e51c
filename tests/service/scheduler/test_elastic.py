"""Elastic jobs in the policy (`service.scheduler.elastic`): a job with a `min_gpu_count`
starts on what is free, a waiting job shrinks one instead of waiting, and one below its
full size grows onto idle GPUs (of its host, or of another by moving), each resize no
sooner than `MIN_RUN_S` after the last."""

from __future__ import annotations

import pytest

from service.scheduler.costs import MIN_RUN_S
from service.scheduler.elastic import rate, speed
from service.scheduler.types import Cluster, FairShare, LabReservation
from tests.service.scheduler.test_policy import HIGH, HOUR, NOW, cluster, job, placed, run, running


def elastic_running(job_id: int, host: str, indices: tuple[int, ...], full: int, **kw: object):
    values: dict[str, object] = {"min_gpu_count": 1, "full_gpu_count": full, "started": NOW - MIN_RUN_S - 1}
    values.update(kw)
    return running(job_id, host, indices, **values)


def test_the_throughput_model_keeps_90_percent_per_doubling() -> None:
    assert (speed(1), speed(2), speed(4)) == pytest.approx((1.0, 1.8, 3.24))
    assert rate(2, 4) == pytest.approx(1.8 / 3.24) and rate(4, 4) == 1.0


def test_an_elastic_job_starts_on_what_is_free_and_a_rigid_one_waits() -> None:
    busy = cluster(4, running=[running(9, "lab-a", (0, 1))])
    assert placed(run([job(1, gpus=4, min_gpu_count=1)], busy)) == {1: ("lab-a", (2, 3))}
    assert placed(run([job(1, gpus=4, min_gpu_count=3)], busy)) == {}, "not below its minimum"
    assert placed(run([job(1, gpus=4)], busy)) == {}


def test_a_waiting_job_shrinks_an_elastic_job_instead_of_waiting() -> None:
    wide = elastic_running(5, "lab-a", (0, 1, 2, 3), full=4)
    decision = run([job(1, gpus=2)], cluster(4, running=[wide]))
    assert decision.shrink == {5: (0, 1)} and placed(decision) == {1: ("lab-a", (2, 3))}
    assert decision.preempt == {} and decision.grow == {}


def test_a_waiting_job_shrinks_on_the_host_where_it_starts_largest_shrinking_the_fewest() -> None:
    """lab-a comes first: a rigid 2-GPU job takes one GPU from each of its two jobs there, but
    one from lab-b's wide job; an elastic 4-GPU job starts on 2 GPUs there, on 4 on lab-b."""
    pair = [elastic_running(5, "lab-a", (0, 1), full=2), elastic_running(6, "lab-a", (2, 3), full=2)]
    wide = elastic_running(7, "lab-b", (0, 1, 2, 3), full=4)
    decision = run([job(1, gpus=2)], cluster(4, 4, running=[*pair, wide]))
    assert decision.shrink == {7: (0, 1)} and placed(decision) == {1: ("lab-b", (2, 3))}
    widest = elastic_running(7, "lab-b", tuple(range(8)), full=8)
    solo = elastic_running(5, "lab-a", (0, 1, 2, 3), full=4)
    decision = run([job(1, gpus=4, min_gpu_count=1)], cluster(4, 8, running=[solo, widest]))
    assert decision.shrink == {7: (0, 1, 2, 3)} and placed(decision) == {1: ("lab-b", (4, 5, 6, 7))}


@pytest.mark.parametrize(
    ("wide", "why"),
    [
        (elastic_running(5, "lab-a", (0, 1, 2, 3), full=4, started=NOW - 60), "resized less than MIN_RUN_S ago"),
        (elastic_running(5, "lab-a", (0, 1, 2, 3), full=4, priority=HIGH), "of a higher priority"),
        (elastic_running(5, "lab-a", (0, 1, 2, 3), full=4, min_gpu_count=3), "it would go below its minimum"),
        (running(5, "lab-a", (0, 1, 2, 3)), "not elastic"),
    ],
)
def test_a_job_is_not_shrunk(wide, why: str) -> None:
    decision = run([job(1, gpus=2)], cluster(4, running=[wide]))
    assert decision.shrink == {} and placed(decision) == {}, why


def test_a_shrink_leaves_a_job_half_of_what_it_holds() -> None:
    """A 4-GPU job cannot take all four of an elastic job's: it would keep two."""
    wide = elastic_running(5, "lab-a", (0, 1, 2, 3), full=4)
    decision = run([job(1, gpus=4)], cluster(4, running=[wide]))
    assert decision.shrink == {} and placed(decision) == {}
    decision = run([job(1, gpus=4, min_gpu_count=1)], cluster(4, running=[wide]))
    assert decision.shrink == {5: (0, 1)} and placed(decision) == {1: ("lab-a", (2, 3))}, "an elastic one takes two"


def test_an_elastic_job_grows_onto_the_idle_gpus_of_its_host() -> None:
    small = elastic_running(5, "lab-a", (0, 1), full=4)
    assert run([], cluster(4, running=[small])).grow == {5: ("lab-a", (0, 1, 2, 3))}
    young = elastic_running(5, "lab-a", (0, 1), full=4, started=NOW - 60)
    assert run([], cluster(4, running=[young])).grow == {}, "resized less than MIN_RUN_S ago"
    ending = elastic_running(5, "lab-a", (0, 1), full=4, estimate_s=MIN_RUN_S + 120, typical_s=MIN_RUN_S + 120)
    assert run([], cluster(4, running=[ending])).grow == {}, "two minutes left: the restart would not pay"


def test_a_waiting_job_takes_idle_gpus_before_an_elastic_job_grows_onto_them() -> None:
    small = elastic_running(5, "lab-a", (0, 1), full=4, started=NOW - 3600)  # likely an hour more
    decision = run([job(1, gpus=1)], cluster(4, running=[small]))
    assert placed(decision) == {1: ("lab-a", (2,))} and decision.grow == {5: ("lab-a", (0, 1, 3))}


def test_an_elastic_job_grows_by_moving_to_a_host_with_more_idle_gpus() -> None:
    small = elastic_running(5, "lab-a", (0,), full=4)
    busy = cluster(4, 4, running=[small, running(9, "lab-a", (1, 2, 3))])
    assert run([], busy).grow == {5: ("lab-b", (0, 1, 2, 3))}


def test_elastic_jobs_move_off_a_host_to_free_it_for_a_whole_host_job() -> None:
    """A job that needs a whole host, which no host has free, gets one when the elastic jobs
    on it fit, at their size, onto idle GPUs of other hosts: they move there and it starts."""
    mover = elastic_running(5, "lab-a", (0, 1), full=2)
    rigid = running(9, "lab-b", (0, 1))
    decision = run([job(1, gpus=4)], cluster(4, 4, running=[mover, rigid]))
    assert decision.grow == {5: ("lab-b", (2, 3))} and decision.moved_for == {5: 1}
    assert placed(decision) == {1: ("lab-a", (0, 1, 2, 3))} and decision.preempt == {} and decision.shrink == {}
    assert placed(run([job(1, gpus=2)], cluster(4, 4, running=[mover, rigid]))) == {1: ("lab-a", (2, 3))}, (
        "one that fits moves nobody"
    )


@pytest.mark.parametrize(
    ("mover", "rigid", "why"),
    [
        (elastic_running(5, "lab-a", (0, 1), full=2, started=NOW - 60), (0, 1), "resized less than MIN_RUN_S ago"),
        (elastic_running(5, "lab-a", (0, 1), full=2, priority=HIGH), (0, 1), "of a higher priority"),
        (elastic_running(5, "lab-a", (0, 1), full=2), (0, 1, 2), "one idle GPU elsewhere: it would not fit"),
        (elastic_running(5, "lab-a", (0, 1), full=2, fraction=0.5), (0, 1), "on parts of GPUs"),
        (running(5, "lab-a", (0, 1)), (0, 1), "not elastic"),
    ],
)
def test_a_job_is_not_moved(mover, rigid: tuple[int, ...], why: str) -> None:
    decision = run([job(1, gpus=4)], cluster(4, 4, running=[mover, running(9, "lab-b", rigid)]))
    assert decision.grow == {} and decision.moved_for == {} and placed(decision) == {}, why


def test_a_job_resized_in_a_pass_is_not_also_stopped_in_it() -> None:
    """A shrunk job past its time slice is not then sliced for the next waiting job of the
    same pass: live the stop would win, the resize would be lost, and the job it shrank for
    would wait for GPUs the stop hands to the queue (the simulator restarted it on the GPUs
    it kept and then requeued it; 32 times on the Philly file with every job elastic)."""
    wide = elastic_running(5, "lab-a", (0, 1, 2, 3), full=4, served_gpu_s=4 * 3 * HOUR, run_served_gpu_s=0.0)
    decision = run([job(1, gpus=2), job(2, "bob", gpus=2)], cluster(4, running=[wide]), demote_after_gpu_s=HOUR)
    assert decision.shrink == {5: (0, 1)} and placed(decision) == {1: ("lab-a", (2, 3))}
    assert decision.preempt == {}, "job 2 waits for the next pass"


def test_resizes_do_not_keep_an_elastic_job_from_time_slicing() -> None:
    """Each resize starts a new attempt, and time slicing stopped an attempt only once it had
    run as long as the earlier ones at its present size: a job shrunk from 4 GPUs to 1 after
    3 hours had 12 more hours to run before it could be sliced, and one resized every
    `MIN_RUN_S` never could (in the simulator, half of the elastic jobs on the Philly window
    made its whole-host gangs wait longer than with none elastic). Slicing counts the run,
    since the job last left the queue (`run_served_gpu_s`), across its resizes."""
    rigid = [running(100 + i, "lab-a", (i,), started=NOW - 60) for i in (1, 2, 3)]

    def sliced(**kw: object) -> bool:
        shrunk = elastic_running(5, "lab-a", (0,), full=4, started=NOW - MIN_RUN_S - 1, served_gpu_s=4 * 3 * HOUR, **kw)
        decision = run([job(1)], cluster(4, running=[shrunk, *rigid]), demote_after_gpu_s=HOUR)
        return decision.preempt == {5: 1}

    assert sliced(run_served_gpu_s=0.0), "its run has served 12 GPU-hours: it has had its slice"
    assert not sliced(run_served_gpu_s=8 * HOUR), "its run has served 4 of the 8 GPU-hours before it: not yet"
    assert not sliced(), "as before for a job whose attempt is its run: 12 hours more on 1 GPU"


def test_a_job_of_the_group_gpus_are_kept_for_shrinks_after_one_of_another_group_could_not() -> None:
    """GPUs kept for a group (a lab reservation whose window is near) open to its jobs only:
    another group's job finds nothing to shrink there, and one of the group, of the same size,
    coming after it in the pass, still does (the pass once remembered the shape as "nothing
    to shrink" whatever its group or end)."""
    wide = elastic_running(5, "lab-a", (0, 1, 2, 3), full=4)
    kept = LabReservation(1, "vision", NOW + HOUR, NOW + 5 * HOUR, tuple(("lab-a", i) for i in range(4)))
    busy = Cluster(cluster(4, running=[wide]).hosts, [wide], [kept])
    queue = [job(1, gpus=2), job(2, gpus=2, group="vision")]
    decision = run(queue, busy, fair_share=FairShare(group_usage={"vision": 10 * HOUR}))  # job 1 first
    assert decision.shrink == {5: (0, 1)} and placed(decision) == {2: ("lab-a", (2, 3))}


def test_a_started_job_is_elastic_on_one_host_and_whole_over_several() -> None:
    """`QueuedJob.parts_on`, which the simulator, the forecast and a live resize start jobs by."""
    queued = job(1, gpus=4, min_gpu_count=1, limit_s=HOUR, served_gpu_s=60.0, group="vision")
    (one,) = queued.parts_on([("lab-a", (0, 1))], NOW)
    assert (one.host, one.indices, one.started, one.end) == ("lab-a", (0, 1), NOW, NOW + HOUR)
    assert (one.min_gpu_count, one.full_gpu_count, one.job_gpu_load) == (1, 4, None)
    assert (one.served_gpu_s, one.group, one.elastic) == (60.0, "vision", True)
    first, second = queued.parts_on([("lab-a", (0, 1)), ("lab-b", (0, 1))], NOW)
    assert (first.host, second.host) == ("lab-a", "lab-b")
    assert first.job_gpu_load == second.job_gpu_load == 4.0 and first.whole_load == 4.0
    assert not first.elastic and not second.elastic, "a job over several hosts is not resized"
    (rigid,) = job(2, gpus=2).parts_on([("lab-a", (0, 1))], NOW)
    assert not rigid.elastic and rigid.full_gpu_count is None
