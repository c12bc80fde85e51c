"""The simulated cluster the forecast and the trace simulator share."""

from service.scheduler.clock import Happens, SimCluster, SliceWakeups
from service.scheduler.costs import CHECKPOINT_S, MIN_RUN_S
from service.scheduler.types import HostCapacity, QueuedJob, RunningJob


def part(job_id: int, host: str = "h0", indices: tuple[int, ...] = (0,), fraction: float = 1.0, at: float = 0.0):  # type: ignore[no-untyped-def]
    return RunningJob(job_id, "ann", 1, host, indices, fraction, at)


def cluster(hosts: int = 1, gpus: int = 2) -> SimCluster:
    return SimCluster([HostCapacity(f"h{i}", [1.0] * gpus) for i in range(hosts)])


def test_a_job_takes_its_fraction_of_each_gpu_on_each_host_and_gives_it_back_at_its_end() -> None:
    sim = cluster(hosts=2)
    sim.start([part(1, "h0", (0, 1), 0.5), part(1, "h1", (1,), 0.5)], run_s=100)
    assert [h.free for h in sim.hosts] == [[0.5, 0.5], [1.0, 0.5]]
    assert sim.next_time() == 100
    events = list(sim.due(100))
    assert [(e.happens, e.job_id) for e in events] == [(Happens.END, 1)]
    assert len(sim.release(1)) == 2
    assert [h.free for h in sim.hosts] == [[1.0, 1.0], [1.0, 1.0]]
    assert sim.running == []


def test_a_stopped_job_holds_its_gpus_while_it_checkpoints_and_its_old_end_is_dropped_after_a_restart() -> None:
    sim = cluster()
    sim.start([part(1)], run_s=1000)
    assert sim.stop(1, now=10)
    assert not sim.stop(1, now=11), "a job already stopping is not stopped twice"
    assert [e.happens for e in sim.due(10 + CHECKPOINT_S)] == [Happens.STOPPED]
    sim.release(1)
    sim.start([part(1, at=50)], run_s=2000)  # its next attempt
    assert sim.next_time() == 1000, "the clock still stops where the old end was planned"
    assert list(sim.due(1000)) == [], "but the end of an attempt that is over is dropped"
    assert [(e.time, e.happens) for e in sim.due(2050)] == [(2050, Happens.END)]


def test_a_gpu_that_takes_no_new_work_is_not_given_back() -> None:
    host = HostCapacity("h0", [0.0, 1.0], unusable=frozenset({0}))
    sim = SimCluster([host], [part(1)])
    sim.release(1)
    assert host.free == [0.0, 1.0]


def test_slice_wakeups_come_when_a_running_job_may_first_be_stopped_and_only_while_fresh_work_waits() -> None:
    sim = cluster()
    long = part(1)
    long.typical_s = 10 * MIN_RUN_S  # likely to run past its slice
    sim.start([long], run_s=10 * MIN_RUN_S)
    slices = SliceWakeups(slice_gpu_s=60)
    served = QueuedJob(2, "bob", 1, 1, 1.0, 0.0, served_gpu_s=600)
    slices.plan(sim, 0, [served])
    assert sim.next_time() == 10 * MIN_RUN_S, "no fresh work: no wake-up"
    slices.plan(sim, 0, [QueuedJob(3, "bob", 1, 1, 1.0, 0.0)])
    assert sim.next_time() == MIN_RUN_S
    slices.plan(sim, 1, [QueuedJob(3, "bob", 1, 1, 1.0, 0.0)])
    assert [e.happens for e in sim.due(MIN_RUN_S)] == [Happens.WAKE], "each attempt is looked at once"
