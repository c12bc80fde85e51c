"""The scheduling policy as a pure function: what starts, where, and why the rest waits."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.defaults import DAY
from service.scheduler.explain import describe
from service.scheduler.policy import schedule
from service.scheduler.types import (
    Cluster,
    FairShare,
    HostCapacity,
    Policy,
    PolicyConfig,
    QueuedJob,
    RunningJob,
)
from service.scheduler.victims import MAX_SLICES_PER_PASS

NOW = 1_000_000.0
HIGH, NORMAL, LOW = 0, 1, 2


def hosts(*sizes: int, busy: dict[str, list[int]] | None = None) -> list[HostCapacity]:
    out = []
    for n, size in enumerate(sizes):
        name = f"lab-{'abcdefgh'[n]}"
        free = [0.0 if i in (busy or {}).get(name, []) else 1.0 for i in range(size)]
        out.append(HostCapacity(name, free))
    return out


def cluster(
    *sizes: int, running: list[RunningJob] | None = None, drained: dict[str, set[int]] | None = None
) -> Cluster:
    """Hosts lab-a, lab-b, ... of these sizes, with the running jobs' GPUs taken."""
    built = hosts(*sizes)
    by_name = {h.name: h for h in built}
    for r in running or []:
        for i in r.indices:
            by_name[r.host].free[i] -= r.fraction
    for name, indices in (drained or {}).items():
        for i in indices:
            by_name[name].free[i] = 0.0
        by_name[name].unusable = frozenset(indices)
    return Cluster(built, list(running or []))


def job(job_id: int, user: str = "alice", gpus: int = 1, **kw: object) -> QueuedJob:
    values: dict[str, object] = {"priority": NORMAL, "fraction": 1.0, "submitted": NOW - 100 + job_id}
    values.update(kw)
    return QueuedJob(job_id, user, gpu_count=gpus, **values)


def running(job_id: int, host: str, indices: tuple[int, ...], **kw: object) -> RunningJob:
    values: dict[str, object] = {"user": "zed", "priority": NORMAL, "fraction": 1.0, "started": NOW - 50}
    values.update(kw)
    return RunningJob(job_id, host=host, indices=indices, **values)


def run(queued, cluster, policy=Policy.TOWERQ, usage=None, **config):
    fair = config.pop("fair_share", None) or FairShare(usage=usage or {})
    return schedule(queued, cluster, fair, NOW, PolicyConfig(policy=policy, **config))


def placed(decision) -> dict[int, tuple[str, tuple[int, ...]]]:
    return {p.job_id: (p.host, p.indices) for p in decision.placements}


def reasons(decision) -> dict[int, str]:
    return {p.job_id: describe(p.reason, NOW) for p in decision.pending}


def test_fifo_lets_nothing_pass_a_blocked_head() -> None:
    d = run([job(1, gpus=4), job(2)], Cluster(hosts(4, busy={"lab-a": [0]})), Policy.FIFO)
    assert placed(d) == {}
    assert reasons(d)[2] == "behind job 1 (strict FIFO)"


def test_fit_first_starts_anything_that_fits_in_submit_order() -> None:
    d = run([job(1, gpus=4), job(2), job(3, gpus=2), job(4)], Cluster(hosts(4, busy={"lab-a": [0]})), Policy.FIT_FIRST)
    assert set(placed(d)) == {2, 3}


def test_the_user_who_used_less_goes_first_and_a_users_jobs_keep_their_order() -> None:
    queue = [job(1, "heavy"), job(2, "heavy"), job(3, "light"), job(4, "light")]
    d = run(queue, Cluster(hosts(2)), usage={"heavy": 1e6, "light": 10.0})
    assert set(placed(d)) == {3, 4}
    assert [p.job_id for p in d.pending] == [1, 2]
    assert [p.position for p in d.pending] == [1, 2]


def test_users_with_equal_usage_share_the_gpus_that_free_up_in_one_pass() -> None:
    queue = [job(i, "alice") for i in range(1, 5)] + [job(i, "bob") for i in range(5, 9)]
    d = run(queue, Cluster(hosts(4)))
    users = defaultdict(int)
    for job_id in placed(d):
        users["alice" if job_id < 5 else "bob"] += 1
    assert users == {"alice": 2, "bob": 2}


def test_a_larger_share_earns_more_before_the_term_equals() -> None:
    fair = FairShare(usage={"alice": 300.0, "bob": 200.0}, shares={"alice": 3.0, "bob": 1.0})
    d = run([job(1, "bob"), job(2, "alice")], Cluster(hosts(1)), fair_share=fair)
    assert set(placed(d)) == {2}  # alice used 60% with a 75% share; bob 40% of a 25% share


def test_priority_classes_come_first_and_waiting_lifts_a_job() -> None:
    fresh_normal = job(1, priority=NORMAL, submitted=NOW - 10)
    high = job(2, priority=HIGH, submitted=NOW - 5)
    assert set(placed(run([fresh_normal, high], Cluster(hosts(1))))) == {2}
    old_low = job(3, priority=LOW, submitted=NOW - 3 * DAY)
    d = run([fresh_normal, old_low], Cluster(hosts(1)), aging_s=DAY)
    assert set(placed(d)) == {3}  # three days of waiting beat two classes


def test_among_fresh_jobs_smaller_gangs_go_first_until_the_big_one_has_waited() -> None:
    # Four GPUs free: an 8-GPU job cannot start anyway, but between a fresh 4-GPU job and
    # two later 2-GPU ones, the small ones go first (0.3 of a class per doubling)...
    big, small = job(1, gpus=4, submitted=NOW - 60), [job(2, gpus=2), job(3, gpus=2)]
    assert set(placed(run([big, *small], Cluster(hosts(4))))) == {2, 3}
    # ...still after three hours (the size fades), not once it may claim a reservation.
    waited = job(1, gpus=4, submitted=NOW - 3 * 3600)
    assert set(placed(run([waited, *small], Cluster(hosts(4)), reserve_after_s=DAY))) == {2, 3}
    old = job(1, gpus=4, submitted=NOW - DAY)
    assert set(placed(run([old, *small], Cluster(hosts(4)), reserve_after_s=DAY))) == {1}
    # A class apart, size does not overturn priority.
    high_big = job(1, gpus=4, priority=HIGH, submitted=NOW - 60)
    assert set(placed(run([high_big, *small], Cluster(hosts(4))))) == {1}


def test_a_tight_time_limit_goes_first_and_giving_one_never_costs_rank() -> None:
    # One GPU free, one user, three fresh jobs: the one with a ten-minute limit starts
    # before an older one with no limit and one with a two-hour limit.
    queue = [job(1), job(2, limit_s=2 * 3600.0), job(3, limit_s=600.0)]
    assert set(placed(run(queue, Cluster(hosts(1))))) == {3}
    # Giving any limit never ranks a job below the same job without one; eight hours and
    # more rank as no limit (the older then goes first), and so does the owner's median.
    for limit in (60.0, 3600.0, 8 * 3600.0, 30 * DAY):
        for typical in (None, 120.0, 20 * 3600.0):
            without = job(1, typical_s=typical)
            with_limit = job(2, limit_s=limit, typical_s=typical)
            assert set(placed(run([without, with_limit], Cluster(hosts(1))))) == ({2} if limit < 8 * 3600.0 else {1}), (
                limit,
                typical,
            )
    # A job's limit caps its owner's median: a 5-minute job of a user whose runs take a day
    # outranks another user's no-limit job with an hour's median.
    short = job(2, "bob", limit_s=300.0, typical_s=DAY)
    assert set(placed(run([job(1, "alice", typical_s=3600.0), short], Cluster(hosts(1))))) == {2}
    # Fair share still weighs more than a limit within a few doublings of another's.
    d = run(
        [job(1, "heavy", limit_s=1800.0), job(2, "light", limit_s=3600.0)],
        Cluster(hosts(1)),
        usage={"heavy": 1e6, "light": 10.0},
    )
    assert set(placed(d)) == {2}


def test_a_user_at_their_gpu_limit_waits_with_the_reason_in_words() -> None:
    busy = cluster(8, running=[running(90, "lab-a", (0, 1, 2, 3), user="alice")])
    fair = FairShare(limits={"alice": 4.0})
    d = run([job(1, "alice"), job(2, "bob")], busy, fair_share=fair)
    assert set(placed(d)) == {2}
    assert reasons(d)[1] == "user limit: alice uses 4 of 4 GPUs"


def test_fractions_share_a_gpu_up_to_one_and_a_whole_job_never_shares() -> None:
    queue = [job(1, fraction=0.5), job(2, fraction=0.5), job(3), job(4, fraction=0.5)]
    d = run(queue, Cluster(hosts(2)))
    assert placed(d)[1][1] == placed(d)[2][1]  # packed onto one GPU
    assert placed(d)[3][1] != placed(d)[1][1]
    assert 4 not in placed(d)


def test_jobs_bound_to_a_host_and_gpus_go_only_there() -> None:
    two = Cluster(hosts(4, 4))
    d = run([job(1, host="lab-b", indices=(2, 3), gpus=2), job(2, host="lab-b", gpus=2)], two)
    assert placed(d) == {1: ("lab-b", (2, 3)), 2: ("lab-b", (0, 1))}
    down = run([job(3, host="lab-z")], two)
    assert reasons(down)[3] == "host lab-z is down or not registered"


def test_a_job_that_may_run_only_on_some_hosts_is_placed_and_makes_room_only_there() -> None:
    """`QueuedJob.hosts` (a notebook session where some workers run none): the best fit,
    preemption and the wait's reason keep to those hosts; with none of them up it says so."""
    d = run([job(1, hosts=frozenset({"lab-b"}))], Cluster(hosts(1, 2)))
    assert placed(d) == {1: ("lab-b", (0,))}, "lab-a is the tighter fit, and not its host"
    low = [running(100, "lab-a", (0,), priority=LOW), running(101, "lab-b", (0,), priority=LOW, started=NOW - 500)]
    urgent = job(2, priority=HIGH, hosts=frozenset({"lab-b"}))
    on = run([urgent], cluster(1, 1, running=low), preemption=True)
    assert set(on.preempt) == {101}, "job 100 is younger, but on a host it may not run on"
    busy = run([job(3, hosts=frozenset({"lab-b"}))], cluster(1, 1, running=low))
    assert reasons(busy)[3].startswith("waiting for 1 free GPU on lab-b (job 101"), reasons(busy)
    nowhere = run([job(4, hosts=frozenset({"lab-z"}))], Cluster(hosts(1, 2)))
    said = "no host that may run it is up (a notebook session runs where its worker runs sessions)"
    assert reasons(nowhere)[4] == said


def test_a_drained_gpu_takes_no_job() -> None:
    d = run([job(1, host="lab-a", indices=(0,)), job(2, gpus=2)], cluster(2, drained={"lab-a": {0}}))
    assert reasons(d)[1] == "GPU 0 on lab-a drained or absent"
    assert 2 not in placed(d)


def test_busy_gpus_are_explained_with_the_holder_and_its_end() -> None:
    busy = cluster(2, running=[running(12, "lab-a", (1,), limit_s=3600.0, started=NOW - 600)])
    d = run([job(1, host="lab-a", indices=(1,))], busy)
    assert reasons(d)[1].startswith("waiting for GPU 1 on lab-a (job 12, ends ~")


def test_a_starving_gang_job_gets_gpus_reserved_and_unbounded_jobs_cannot_take_them() -> None:
    # 8 GPUs: 6 busy on lab-a. A 4-GPU job has waited 3 days; 1-GPU jobs keep coming.
    busy = [running(100 + i, "lab-a", (i,), limit_s=1000.0, started=NOW - 500) for i in range(6)]
    gang = job(1, gpus=4, submitted=NOW - 3 * DAY)
    small = [job(i, submitted=NOW - 10 + i) for i in range(2, 5)]
    d = run([gang, *small], cluster(8, running=busy), reserve_after_s=2 * DAY)
    assert placed(d) == {}, "the two free GPUs are held for the gang job"
    pending = {p.job_id: p for p in d.pending}
    assert pending[1].reserved_start == NOW + 500
    assert "reserved for job 1" in reasons(d)[2]
    # without the guard, fit-first hands the free GPUs to the small jobs
    assert len(placed(run([gang, *small], cluster(8, running=busy), Policy.FIT_FIRST))) == 2


def test_a_job_known_to_end_before_the_reservation_backfills_onto_held_gpus() -> None:
    busy = [running(100 + i, "lab-a", (i,), limit_s=1000.0, started=NOW - 500) for i in range(6)]
    gang = job(1, gpus=4, submitted=NOW - 3 * DAY)
    short, long = job(2, limit_s=300.0), job(3, limit_s=5000.0)
    d = run([gang, short, long], cluster(8, running=busy), reserve_after_s=2 * DAY)
    assert set(placed(d)) == {2}
    likely_short = job(4, estimate_s=300.0)  # no limit, but its owner's jobs end within 300 s
    assert set(placed(run([gang, likely_short], cluster(8, running=busy), reserve_after_s=2 * DAY))) == {4}


def test_one_gpu_jobs_get_no_reservation_they_can_take_any_gpu() -> None:
    busy = [running(100, "lab-a", (0,))]
    d = run([job(1, submitted=NOW - 5 * DAY)], cluster(1, running=busy), reserve_after_s=DAY)
    assert d.pending[0].reserved_start is None


def test_the_reserved_host_is_the_one_expected_to_free_soonest() -> None:
    # lab-a's jobs have run for a day, lab-b's for a minute: lab-b is likely to drain first.
    old = [running(100 + i, "lab-a", (i,), started=NOW - DAY) for i in range(4)]
    young = [running(200 + i, "lab-b", (i,), started=NOW - 60) for i in range(4)]
    d = run([job(1, gpus=4, submitted=NOW - 3 * DAY), job(2)], cluster(4, 4, running=old + young), reserve_after_s=DAY)
    assert "lab-b" in reasons(d)[2]


def test_a_high_job_preempts_the_youngest_low_jobs_only_when_allowed() -> None:
    low = [running(100 + i, "lab-a", (i,), priority=LOW, started=NOW - 100 * (i + 1)) for i in range(4)]
    urgent = job(1, gpus=2, priority=HIGH)
    off = run([urgent], cluster(4, running=low))
    assert off.preempt == {}
    on = run([urgent], cluster(4, running=low), preemption=True)
    assert on.preempt == {100: 1, 101: 1}
    assert reasons(on)[1] == "stopping lower-priority job 100, job 101 on lab-a to make room"
    assert not any(r.stopping for r in low), "the policy does not change what it is given"
    low[0].stopping = low[1].stopping = True
    waiting = run([urgent], cluster(4, running=low), preemption=True)
    assert waiting.preempt == {}, "jobs already stopping are waited for, not joined by more"


def test_normal_jobs_never_preempt() -> None:
    low = [running(100, "lab-a", (0,), priority=LOW)]
    assert run([job(1)], cluster(1, running=low), preemption=True).preempt == {}


HOUR = 3600.0


def test_time_slicing_stops_the_most_served_job_for_fresh_work_only_when_on() -> None:
    long_served = [
        running(100, "lab-a", (0,), started=NOW - 2 * HOUR),
        running(101, "lab-a", (1,), started=NOW - 5 * HOUR),
        running(102, "lab-b", (0,), started=NOW - 0.5 * HOUR),  # not yet had its slice
    ]
    fresh = job(1)
    assert run([fresh], cluster(2, 1, running=long_served)).preempt == {}, "off by default"
    on = run([fresh], cluster(2, 1, running=long_served), demote_after_gpu_s=HOUR)
    assert on.preempt == {101: 1}, "the most served goes first, one is enough"
    assert reasons(on)[1] == "stopping job 101 on lab-a (had their time slice) to make room"
    assert placed(on) == {}, "it starts once the stopped job has checkpointed"


def test_a_stop_must_pay_a_job_is_not_stopped_for_fresh_work_as_long_as_what_it_has_left() -> None:
    """(Issue 29.) Slicing stopped long jobs again and again for work that was itself long.
    The served job's owner's runs say it has about 3 hours left: fresh work known to take
    10 minutes stops it; fresh work known to take 10 hours (its owner's median, or its time
    limit) waits, as it would without slicing; fresh work nothing is known of is sliced in,
    as before (slicing finds out by running it)."""
    served = [running(100, "lab-a", (0,), started=NOW - 2 * HOUR, estimate_s=5 * HOUR, typical_s=4 * HOUR)]
    for fresh, stops in (
        (job(1, typical_s=600.0), True),
        (job(1, typical_s=10 * HOUR), False),
        (job(1, limit_s=10 * HOUR), False),
        (job(1, limit_s=2 * HOUR), True),
        (job(1), True),
    ):
        decision = run([fresh], cluster(1, running=served), demote_after_gpu_s=HOUR)
        assert (decision.preempt == {100: 1}) is stops, fresh


def test_time_slicing_stops_jobs_on_the_host_where_the_fewest_stops_make_room() -> None:
    """lab-a comes first but needs both its jobs stopped; lab-b's one job is enough."""
    served = [
        running(100, "lab-a", (0,), started=NOW - 5 * HOUR),
        running(101, "lab-a", (1,), started=NOW - 5 * HOUR),
        running(102, "lab-b", (0, 1), started=NOW - 2 * HOUR),
    ]
    decision = run([job(1, gpus=2)], cluster(2, 2, running=served), demote_after_gpu_s=HOUR)
    assert decision.preempt == {102: 1}


def test_a_user_above_their_share_stops_no_one_elses_job_by_slicing() -> None:
    """A heavy user feeding fresh short jobs must not keep stopping other members' long
    jobs: slicing only lets a user at or under their share stop another's job."""
    zeds = [running(100, "lab-a", (0,), user="zed", started=NOW - 2 * HOUR)]
    usage = {"heavy": 50 * HOUR, "zed": 2 * HOUR}
    heavy = run([job(1, "heavy")], cluster(1, running=zeds), usage=usage, demote_after_gpu_s=HOUR)
    assert heavy.preempt == {} and placed(heavy) == {}, "above its share: it waits for the GPU"
    light = run([job(1, "light")], cluster(1, running=zeds), usage=usage, demote_after_gpu_s=HOUR)
    assert light.preempt == {100: 1}, "under its share: the served job is sliced"
    own = [running(100, "lab-a", (0,), user="heavy", started=NOW - 2 * HOUR)]
    mine = run([job(1, "heavy")], cluster(1, running=own), usage=usage, demote_after_gpu_s=HOUR)
    assert mine.preempt == {100: 1}, "its own long job it may still slice for its fresh work"


def test_time_slices_double_so_a_job_is_stopped_only_a_few_times() -> None:
    """An attempt is stopped only after MIN_RUN_S and as long as all earlier attempts."""
    cases = {
        # (GPU-seconds of earlier attempts, this attempt's run so far): may it be stopped?
        (4 * HOUR, 2 * HOUR): False,
        (4 * HOUR, 4.5 * HOUR): True,
        (2 * HOUR, 300.0): False,
        (0.0, 1.5 * HOUR): True,
    }
    for (earlier, this_attempt), stopped in cases.items():
        long_run = [running(100, "lab-a", (0,), started=NOW - this_attempt, served_gpu_s=earlier)]
        d = run([job(1)], cluster(1, running=long_run), demote_after_gpu_s=HOUR)
        assert (d.preempt == {100: 1}) is stopped, (earlier, this_attempt)


def test_a_job_over_two_hosts_serves_its_slice_on_both_at_once() -> None:
    """(Issue 27.) Each host's part of a job over several hosts counted only its own GPUs,
    so a 4-GPU job over two hosts served its slice at half the rate (and the stop message
    gave half its GPU-hours). 40 minutes on 4 GPUs is 2.7 GPU-hours: past a 2-hour slice."""
    parts = [running(100, host, (0, 1), started=NOW - 40 * 60, job_gpu_load=4.0) for host in ("lab-a", "lab-b")]
    assert parts[0].served(NOW) == 4 * 40 * 60
    decision = run([job(1)], cluster(2, 2, running=parts), demote_after_gpu_s=2 * HOUR)
    assert decision.preempt == {100: 1}
    assert reasons(decision)[1] == "stopping job 100 on lab-a (had their time slice) to make room"


def test_a_fresh_job_larger_than_a_host_slices_whole_hosts() -> None:
    """(Issue 27.) Victims were looked for one host at a time, so a fresh job larger than any
    host never sliced: it takes whole hosts, those whose every job may be stopped, the
    fewest stops first; a host with a job still in its slice is passed over."""
    served = [
        running(100, "lab-a", (0, 1), started=NOW - 5 * HOUR),
        running(101, "lab-b", (0,), started=NOW - 5 * HOUR),
        running(102, "lab-b", (1,), started=NOW - 5 * HOUR),
        running(103, "lab-c", (0, 1), started=NOW - 4 * HOUR),
        running(104, "lab-d", (0, 1), started=NOW - 600),  # still in its slice
    ]
    decision = run([job(1, gpus=4)], cluster(2, 2, 2, 2, running=served), demote_after_gpu_s=HOUR)
    assert decision.preempt == {100: 1, 103: 1}, "one stop per host beats two"
    assert reasons(decision)[1] == "stopping job 100, job 103 on lab-a + lab-c (had their time slice) to make room"
    assert placed(decision) == {}
    young = [running(100, "lab-a", (0, 1), started=NOW - 5 * HOUR), running(104, "lab-b", (0, 1), started=NOW - 600)]
    none = run([job(1, gpus=4)], cluster(2, 2, running=young), demote_after_gpu_s=HOUR)
    assert none.preempt == {}, "all or nothing: one host alone does not make room"


def test_with_slicing_the_eldest_job_when_it_needs_a_whole_host_goes_first_and_may_slice() -> None:
    """(Issue 29.) With slicing on, fresh and smaller work took every GPU that freed up
    before a whole-host gang, and stopped the gang itself once it had had its slice, so on
    bursty traces such a job waited up to twice as long as in plain submit order. The
    eldest job of the best class, when it needs a whole host, is now considered first, and
    may stop jobs past their slice even when its owner is above their share, even when it
    has had its own slice."""
    usage = {"heavy": 50 * HOUR}
    gang = job(1, "heavy", gpus=2, submitted=NOW - 5 * HOUR, served_gpu_s=2 * HOUR)
    small = job(2, "light", submitted=NOW - 60)
    first = run([gang, small], cluster(2), usage=usage, demote_after_gpu_s=HOUR)
    assert placed(first) == {1: ("lab-a", (0, 1))}, "the eldest gang takes the host first"
    off = run([gang, small], cluster(2), usage=usage)
    assert placed(off) == {2: ("lab-a", (0,))}, "without slicing, the rank order as before"

    served = [running(100, "lab-a", (0, 1), user="zed", started=NOW - 3 * HOUR)]
    sliced = run([gang, small], cluster(2, running=served), usage=usage, demote_after_gpu_s=HOUR)
    assert sliced.preempt == {100: 1}, "above its share, it still stops another's served job"
    assert reasons(sliced)[1] == "stopping job 100 on lab-a (had their time slice) to make room"
    younger = job(1, "heavy", gpus=2, submitted=NOW - 30)
    not_eldest = run([younger, small], cluster(2, running=served), usage=usage, demote_after_gpu_s=HOUR)
    assert not_eldest.preempt == {100: 2}, "a gang that is not the eldest keeps the share rule: fresh work slices"
    urgent = job(3, "light", priority=HIGH, submitted=NOW - 10)
    behind = run([gang, urgent], cluster(2), usage=usage, demote_after_gpu_s=HOUR)
    assert placed(behind) == {3: ("lab-a", (0,))}, "a higher class still goes first"


def test_a_served_job_ranks_behind_fresh_work_and_stops_nobody() -> None:
    again = job(1, submitted=NOW - 2 * HOUR, served_gpu_s=3 * HOUR)  # stopped once, queued again
    fresh = job(2, submitted=NOW - 60)
    d = run([again, fresh], Cluster(hosts(1)), demote_after_gpu_s=HOUR)
    assert placed(d) == {2: ("lab-a", (0,))}
    long_run = [running(100, "lab-a", (0,), started=NOW - 5 * HOUR)]
    assert run([again], cluster(1, running=long_run), demote_after_gpu_s=HOUR).preempt == {}


def test_among_jobs_past_their_slice_the_least_served_go_first_except_whole_host_jobs() -> None:
    """(Issue 29.) Multi-level least attained service: a job stopped after a day of GPU
    time ranks below one stopped after two hours, however long it has waited less (here
    an hour), up to one more class. A job that needs a whole host keeps the one demoted
    class: its GPU time grows as fast as its width."""
    day_served = job(1, submitted=NOW - 3 * HOUR, served_gpu_s=24 * HOUR)
    hours_served = job(2, submitted=NOW - 2 * HOUR, served_gpu_s=2 * HOUR)
    d = run([day_served, hours_served], Cluster(hosts(2, busy={"lab-a": [1]})), demote_after_gpu_s=HOUR)
    assert placed(d) == {2: ("lab-a", (0,))}, "the less served goes first"
    off = run([day_served, hours_served], Cluster(hosts(2, busy={"lab-a": [1]})))
    assert placed(off) == {1: ("lab-a", (0,))}, "without slicing, the elder"
    eldest = job(3, submitted=NOW - 10 * HOUR)  # one GPU: no whole-host job goes first by age
    wide_served = job(1, gpus=2, submitted=NOW - 3 * HOUR, served_gpu_s=48 * HOUR)
    wide_fresher = job(2, gpus=2, submitted=NOW - 2 * HOUR, served_gpu_s=2 * HOUR)
    d = run([eldest, wide_served, wide_fresher], Cluster(hosts(1, 2)), demote_after_gpu_s=HOUR)
    assert placed(d) == {3: ("lab-a", (0,)), 1: ("lab-b", (0, 1))}, "whole-host jobs keep their age order"
    aged = job(1, submitted=NOW - 30 * DAY, served_gpu_s=1000 * HOUR)
    d = run([aged, hours_served], Cluster(hosts(2, busy={"lab-a": [1]})), demote_after_gpu_s=HOUR)
    assert placed(d) == {1: ("lab-a", (0,))}, "at most one class more: aging still lifts it"


def test_time_slicing_never_stops_higher_priority_work() -> None:
    urgent_run = [running(100, "lab-a", (0,), priority=HIGH, started=NOW - 5 * HOUR)]
    assert run([job(1)], cluster(1, running=urgent_run), demote_after_gpu_s=HOUR).preempt == {}
    low_run = [running(100, "lab-a", (0,), priority=LOW, started=NOW - 5 * HOUR)]
    assert run([job(1)], cluster(1, running=low_run), demote_after_gpu_s=HOUR).preempt == {100: 1}


def test_with_preemption_on_a_high_job_with_no_low_job_to_stop_still_slices_time() -> None:
    normal_run = [running(100, "lab-a", (0,), started=NOW - 5 * HOUR)]
    urgent = job(1, priority=HIGH)
    d = run([urgent], cluster(1, running=normal_run), preemption=True, demote_after_gpu_s=HOUR)
    assert d.preempt == {100: 1} and d.sliced == {100}
    assert run([urgent], cluster(1, running=normal_run), preemption=True).preempt == {}
    low_run = [running(101, "lab-a", (0,), priority=LOW, started=NOW - 60)]
    d = run([urgent], cluster(1, running=low_run), preemption=True, demote_after_gpu_s=HOUR)
    assert d.preempt == {101: 1} and d.sliced == set(), "preemption first: a low job, however young"


def test_one_pass_stops_at_most_max_slices_per_pass_jobs_and_the_next_pass_the_rest() -> None:
    busy = [running(100 + i, "lab-a", (i,), started=NOW - 2 * HOUR - i) for i in range(MAX_SLICES_PER_PASS + 8)]
    fresh = [job(i) for i in range(1, len(busy) + 1)]
    first = run(fresh, cluster(len(busy), running=busy), demote_after_gpu_s=HOUR)
    assert len(first.preempt) == len(first.sliced) == MAX_SLICES_PER_PASS
    oldest = {r.id for r in sorted(busy, key=lambda r: r.started)[:MAX_SLICES_PER_PASS]}
    assert set(first.preempt) == oldest, "the most served first"
    for r in busy:
        r.stopping = r.id in first.preempt
    second = run(fresh, cluster(len(busy), running=busy), demote_after_gpu_s=HOUR)
    assert len(second.preempt) == 8 and not set(second.preempt) & oldest


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    jobs=st.lists(
        st.tuples(st.integers(1, 4), st.sampled_from([1.0, 0.5, 0.25, 0.3]), st.sampled_from(["a", "b", "c"])),
        max_size=30,
    ),
    policy=st.sampled_from(list(Policy)),
)
def test_no_gpu_is_ever_given_more_than_it_has(sizes: list[int], jobs, policy: Policy) -> None:
    queue = [job(i, user, gpus=g, fraction=f) for i, (g, f, user) in enumerate(jobs)]
    d = run(queue, cluster(*sizes), policy)
    load: dict[tuple[str, int], float] = defaultdict(float)
    fractions = {q.id: q for q in queue}
    for placement in d.placements:
        q = fractions[placement.job_id]
        gpus = [(host, i) for host, indices in placement.slots for i in indices]
        assert len(set(gpus)) == len(gpus)
        if len(placement.slots) == 1:
            assert len(gpus) == q.gpu_count
        else:  # larger than any host: whole hosts (trace replay), at least what it asked for
            assert len(gpus) >= q.gpu_count > max(sizes)
        for gpu in gpus:
            load[gpu] += q.fraction
    assert all(v <= 1.0 + 1e-9 for v in load.values()), load
    assert {p.job_id for p in d.placements}.isdisjoint({p.job_id for p in d.pending})


def test_a_heavy_users_old_gang_job_gets_the_reservation_before_lighter_users_newer_ones() -> None:
    """Reservations go by age among starving gang jobs: the heavy user's fair-share term
    ranks their 4-GPU job behind a light user's, but it has waited longer, so it is the one
    the GPUs are held for (with one reservation allowed)."""
    busy = [running(100 + i, "lab-a", (i,), limit_s=1000.0 + 100 * i, started=NOW - 500) for i in range(8)]
    heavy = job(1, "heavy", gpus=4, submitted=NOW - 4 * DAY)
    light = job(2, "light", gpus=4, submitted=NOW - 3 * DAY)
    usage = {"heavy": 1e9, "light": 0.0}
    d = run([light, heavy], cluster(8, running=busy), usage=usage, reserve_after_s=2 * DAY, max_reservations=1)
    pending = {p.job_id: p for p in d.pending}
    assert pending[1].reserved_start is not None and pending[2].reserved_start is None
    assert pending[1].position == 1  # the eldest starving gang job is considered first


def test_a_jobs_age_is_the_time_it_waited_not_the_time_it_ran_before_a_stop() -> None:
    """(Issue 29.) The starvation guard went by submit time, so a gang stopped by time
    slicing after days of running counted as starving the moment it was queued again: it
    took a reservation at once (idling GPUs for work that had just had its turn) and, being
    the "eldest", kept a whole-host gang that had truly waited longer from going first. Age
    is now the time waited (`QueuedJob.waiting_since`)."""
    busy = [running(100 + i, "lab-a", (i,), limit_s=1000.0 + 100 * i, started=NOW - 500) for i in range(8)]
    sliced = job(1, gpus=4, submitted=NOW - 3 * DAY, served_gpu_s=4 * 2.5 * DAY)  # ran 2.5 days, waited 0.5
    waited = job(2, gpus=4, submitted=NOW - 1.5 * DAY)
    d = run([sliced, waited], cluster(8, running=busy), reserve_after_s=DAY, max_reservations=1)
    pending = {p.job_id: p for p in d.pending}
    assert pending[2].reserved_start is not None and pending[1].reserved_start is None
    alone = run([sliced], cluster(8, running=busy), reserve_after_s=DAY)
    assert alone.pending[0].reserved_start is None, "half a day in the queue is not starving"

    usage = {"heavy": 50 * HOUR}
    gang = job(3, "heavy", gpus=2, submitted=NOW - 5 * HOUR)  # waited 5 h
    again = job(4, "light", submitted=NOW - 10 * HOUR, served_gpu_s=9 * HOUR)  # waited 1 h
    served = [running(100, "lab-a", (0, 1), user="zed", started=NOW - 3 * HOUR)]
    d = run([gang, again], cluster(2, running=served), usage=usage, demote_after_gpu_s=HOUR)
    assert d.preempt == {100: 3}, "the gang has waited longest: it is the eldest, and may slice"


def test_the_eldest_starving_gang_job_starts_before_a_crowd_of_better_ranked_small_jobs() -> None:
    """Eight free GPUs, a light user's eight fresh 1-GPU jobs and the heavy user's 8-GPU job
    that has waited past reserve_after_s: the gang job starts now; by rank alone the small
    jobs would take every GPU again and it would wait on."""
    small = [job(10 + i, "light", submitted=NOW - 10) for i in range(8)]
    gang = job(1, "heavy", gpus=8, submitted=NOW - 3 * DAY)
    usage = {"heavy": 1e9, "light": 0.0}
    d = run([*small, gang], cluster(8), usage=usage, reserve_after_s=2 * DAY)
    assert set(placed(d)) == {1}
    not_yet = run([*small, gang], cluster(8), usage=usage, reserve_after_s=4 * DAY)
    assert 1 not in placed(not_yet) and len(placed(not_yet)) == 8  # before it starves, rank rules


def test_a_command_job_that_does_not_resume_is_neither_preempted_nor_sliced() -> None:
    """(Issue 51.) A command job says whether it resumes from its checkpoint folder; one that
    does not would lose its work: preemption and time slicing pass it over for one that does."""
    keeps = running(100, "lab-a", (0,), priority=LOW, started=NOW - 5 * HOUR, stoppable=False)
    resumes = running(101, "lab-a", (1,), priority=LOW, started=NOW - 2 * HOUR)
    urgent = job(1, gpus=2, priority=HIGH)
    assert run([urgent], cluster(2, running=[keeps, resumes]), preemption=True).preempt == {}
    assert run([job(1, gpus=1, priority=HIGH)], cluster(2, running=[keeps, resumes]), preemption=True).preempt == {
        101: 1
    }
    sliced = run([job(2)], cluster(2, running=[keeps, resumes]), demote_after_gpu_s=HOUR)
    assert sliced.preempt == {101: 2}, "the most served is passed over: it does not resume"


def test_a_job_long_past_its_time_limit_counts_no_negative_use() -> None:
    """A running job past its time limit (being stopped, or on a host that stopped
    reporting) has nothing left to run. Its rest counted as negative use once: its owner
    ranked as if owed the lab, and far enough past the limit the fair-share term's power of
    two overflowed (OverflowError: the pass, and so the scheduler, failed for everyone;
    found by test_pass_memo's random clusters)."""
    late = running(100, "lab-a", tuple(range(8)), user="bob", limit_s=1_000.0, started=NOW - 200_000)
    queue = [job(1, "bob"), job(2, "carol")]
    d = run(queue, cluster(8, 1, running=[late]), usage={"bob": 50_000.0, "carol": 1_000.0})
    assert placed(d) == {2: ("lab-b", (0,))}, "bob used far more: carol's job goes first"
