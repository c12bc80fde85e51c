"""Reservations in the policy: GPUs kept for a group over a window. Before it, others' jobs
take them only when sure to end in time (or, with preemption on, very likely to: they are
stopped at the start if not); in it, only the group's jobs; after it, everyone. Waits say
which reservation, and expected starts honour it."""

from __future__ import annotations

from service.scheduler.forecast import forecast
from service.scheduler.types import FairShare, LabReservation, PolicyConfig
from tests.service.scheduler.test_policy import NOW, cluster, job, placed, reasons, run, running

HOUR = 3600.0


def kept(start: float, end: float, gpus=(("lab-a", 0), ("lab-a", 1)), group: str = "nlp") -> LabReservation:
    return LabReservation(1, group, start, end, tuple(gpus))


def with_kept(c, *reservations: LabReservation):
    c.reservations = list(reservations)
    return c


def test_before_the_window_only_jobs_sure_to_end_in_time_borrow_the_kept_gpus() -> None:
    window = kept(NOW + 2 * HOUR - 30, NOW + 6 * HOUR)
    queued = [job(1, "dave", gpus=2, group="vision")]
    d = run(queued, with_kept(cluster(2), window), explain=True)
    assert placed(d) == {}
    said = reasons(d)[1]  # the wait says what would let it run now: a time limit that ends it in time
    assert said.startswith("GPUs 0, 1 on lab-a reserved for group nlp from "), said
    assert said.endswith("(reservation 1): set time_limit_s ≤ 7140 (1h59m) to run before it"), said
    assert placed(run([job(1, "dave", gpus=2, group="vision", limit_s=7140)], with_kept(cluster(2), window))) == {
        1: ("lab-a", (0, 1))
    }  # as said
    short = [job(2, "dave", gpus=2, group="vision", limit_s=HOUR)]
    assert placed(run(short, with_kept(cluster(2), window))) == {2: ("lab-a", (0, 1))}
    too_long = [job(3, "dave", gpus=2, group="vision", limit_s=3 * HOUR)]
    assert placed(run(too_long, with_kept(cluster(2), window))) == {}
    # Very likely done in time (the owner's runs say so) is enough only when it can be stopped.
    likely = [job(4, "dave", gpus=2, group="vision", estimate_s=HOUR)]
    assert placed(run(likely, with_kept(cluster(2), window))) == {}
    assert placed(run(likely, with_kept(cluster(2), window), preemption=True)) == {4: ("lab-a", (0, 1))}
    # The group's own jobs take its GPUs whenever.
    own = [job(5, "erin", gpus=2, group="nlp")]
    assert placed(run(own, with_kept(cluster(2), window))) == {5: ("lab-a", (0, 1))}


def test_in_the_window_only_the_group_takes_them_and_others_are_told_why() -> None:
    window = kept(NOW - HOUR, NOW + 2 * HOUR)
    d = run([job(1, "dave", group="vision", limit_s=60), job(2, "erin", group="nlp")], with_kept(cluster(3), window),
            explain=True)  # fmt: skip
    assert placed(d) == {1: ("lab-a", (2,)), 2: ("lab-a", (0,))}
    d = run([job(3, "dave", gpus=2, group="vision")], with_kept(cluster(3), window), explain=True)
    assert placed(d) == {}
    assert reasons(d)[3].startswith("GPUs 0, 1 on lab-a reserved for group nlp until ")
    # A job with no group is anyone else.
    assert placed(run([job(4, "zed", gpus=2)], with_kept(cluster(3), window))) == {}
    # Over: everyone again.
    over = kept(NOW - 3 * HOUR, NOW - HOUR)
    assert placed(run([job(5, "dave", gpus=3, group="vision")], with_kept(cluster(3), over))) == {
        5: ("lab-a", (0, 1, 2))
    }


def test_a_borrower_still_there_at_the_start_is_stopped_only_with_preemption_on() -> None:
    window = kept(NOW - 60, NOW + 2 * HOUR)
    borrower = running(10, "lab-a", (0, 1), user="dave", group="vision", started=NOW - HOUR)
    own = running(11, "lab-a", (2,), user="erin", group="nlp", started=NOW - HOUR)
    c = cluster(3, running=[borrower, own])
    assert run([], with_kept(c, window), preemption=True).reclaim == {10: 1}
    c = cluster(3, running=[borrower, own])
    assert run([], with_kept(c, window)).reclaim == {}


def test_expected_starts_honour_the_window() -> None:
    window = kept(NOW + HOUR, NOW + 5 * HOUR)
    c = with_kept(cluster(2), window)
    queued = [job(1, "dave", gpus=2, group="vision"), job(2, "erin", gpus=2, group="nlp", limit_s=HOUR)]
    found = forecast(queued, c, FairShare(), NOW, PolicyConfig())
    assert found[2].start == NOW  # its own GPUs, now
    assert found[1].start >= NOW + 5 * HOUR  # nobody else's until the window is over


def test_a_wait_names_every_blocker_that_matters() -> None:
    """lab-a's GPUs are free but kept for nlp now, lab-b's held by a job: the reason said only
    the reservation, as if the job would start when it ends."""
    window = kept(NOW - HOUR, NOW + 2 * HOUR)
    busy = [running(9, "lab-b", (0, 1), limit_s=HOUR, started=NOW - HOUR / 2)]
    d = run([job(1, "dave", gpus=2, group="vision")], with_kept(cluster(2, 2, running=busy), window), explain=True)
    assert placed(d) == {}
    said = reasons(d)[1]
    assert said.startswith("GPUs 0, 1 on lab-a reserved for group nlp until "), said
    assert "; and waiting for 2 free GPUs on lab-b (job 9, ends ~" in said, said
