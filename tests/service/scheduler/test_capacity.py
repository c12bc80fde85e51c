"""`FreeGpus.outlook`'s answers on when a job could start are kept per host (`ready_times`, the soonest
start on each host) and must go with whatever changes that host in the pass: a placement
(`take`), a shrink's released GPUs (`give`), a resized or moved job (`runs_on`), a hold."""

from __future__ import annotations

from service.scheduler.capacity import FreeGpus
from service.scheduler.types import INFINITY
from tests.service.scheduler.test_policy import NOW, cluster, job, running

ENDS = NOW + 100.0


def two_gpus(*indices: int) -> FreeGpus:
    """lab-a with 2 GPUs, a job on `indices` ending at ENDS (its time limit); lab-b with 2 GPUs
    busy for ever (a job without a limit or history)."""
    on_a = running(9, "lab-a", indices, started=NOW - 50, limit_s=150.0)
    on_b = running(8, "lab-b", (0, 1), started=NOW - 50)
    return FreeGpus(cluster(2, 2, running=[on_a, on_b]), NOW)


def soonest(free: FreeGpus, gpus: int = 1) -> tuple[float, tuple[str, tuple[int, ...]]] | None:
    found = free.outlook.earliest(job(1, gpus=gpus), NOW)
    return None if found is None else (found[0], found[2][0])


def test_a_placement_in_the_pass_moves_the_soonest_start() -> None:
    free = two_gpus(0)
    assert soonest(free) == (NOW, ("lab-a", (1,)))
    free.take([("lab-a", (1,))], 1.0)
    assert soonest(free) == (ENDS, ("lab-a", (0,))), "GPU 1 was taken: GPU 0 frees first"


def test_gpus_a_shrink_gives_up_are_free_at_once() -> None:
    free = two_gpus(0, 1)
    assert soonest(free) == (ENDS, ("lab-a", (0,)))
    free.give("lab-a", (1,), 1.0)
    assert soonest(free) == (NOW, ("lab-a", (1,)))


def test_a_job_that_now_runs_on_fewer_gpus_frees_the_rest_no_sooner() -> None:
    """Its GPU 1 is still taken in the pass (nothing gave it back): with no job on it, it is
    not known to free at all."""
    free = two_gpus(0, 1)
    assert free.outlook.ready_times("lab-a", 1.0, NOW) == [(ENDS, ENDS), (ENDS, ENDS)]
    free.runs_on(free.running_on["lab-a"][0], (0,))
    assert free.outlook.ready_times("lab-a", 1.0, NOW) == [(ENDS, ENDS), (INFINITY, INFINITY)]


def test_a_hold_keeps_its_gpus_from_the_next_reservation() -> None:
    free = two_gpus(0, 1)
    assert free.outlook.earliest(job(1), NOW, skip_held=True) is not None
    free.hold(5, [("lab-a", (0, 1))], ENDS, ENDS)
    found = free.outlook.earliest(job(1), NOW, skip_held=True)
    assert found is not None and found[0] == INFINITY, "lab-b never frees; lab-a's GPUs are held"
