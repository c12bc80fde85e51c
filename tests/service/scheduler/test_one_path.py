"""One policy, one path: the simulator asks for no reasons (`explain=False`), the live
scheduler for every job's reason (`explain=True`); both must start, place and preempt the
same jobs, with every option of the policy on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.defaults import DAY
from service.scheduler.policy import schedule
from service.scheduler.types import Cluster, FairShare, HostCapacity, Policy, PolicyConfig, QueuedJob, RunningJob

NOW = 10 * DAY
USERS = ["a", "b", "c"]


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    built = [HostCapacity(f"h{n}", [1.0] * size) for n, size in enumerate(sizes)]
    running = []
    for n, host in enumerate(built):
        for i in range(len(host.free)):
            if draw(st.booleans()):
                fraction = draw(st.sampled_from([1.0, 0.5]))
                host.free[i] -= fraction
                running.append(
                    RunningJob(
                        1000 + 10 * n + i,
                        draw(st.sampled_from(USERS)),
                        draw(st.sampled_from([0, 1, 2])),
                        host.name,
                        (i,),
                        fraction,
                        NOW - draw(st.floats(0, DAY)),
                        limit_s=draw(st.sampled_from([None, 600.0, 7200.0])),
                        stopping=draw(st.booleans()) and draw(st.booleans()),
                        estimate_s=draw(st.sampled_from([None, 300.0, 3600.0])),
                    )
                )
    return Cluster(built, running)


@st.composite
def queues(draw: st.DrawFn, hosts: list[str]) -> list[QueuedJob]:
    jobs = []
    for job_id in range(draw(st.integers(0, 25))):
        pinned = draw(st.sampled_from([None, *hosts])) if draw(st.integers(0, 4)) == 0 else None
        jobs.append(
            QueuedJob(
                job_id,
                draw(st.sampled_from(USERS)),
                draw(st.sampled_from([0, 1, 1, 2])),
                draw(st.sampled_from([1, 1, 2, 3, 4])),
                draw(st.sampled_from([1.0, 1.0, 0.5, 0.25])),
                NOW - draw(st.sampled_from([10.0, 3600.0, 2 * DAY, 5 * DAY])) + job_id,
                host=pinned,
                limit_s=draw(st.sampled_from([None, 300.0, 5000.0])),
                estimate_s=draw(st.sampled_from([None, 200.0, 4000.0])),
            )
        )
    return jobs


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_with_and_without_reasons_the_same_jobs_start_in_the_same_places(data: st.DataObject) -> None:
    cluster = data.draw(clusters())
    queue = data.draw(queues([h.name for h in cluster.hosts]))
    fair = FairShare(
        usage={u: data.draw(st.floats(0, 1e6)) for u in USERS},
        shares={"a": data.draw(st.sampled_from([1.0, 2.0]))},
        default_limit=data.draw(st.sampled_from([None, 2.0, 4.0])),
    )
    options = {
        "policy": data.draw(st.sampled_from(list(Policy))),
        "preemption": data.draw(st.booleans()),
        "max_reservations": data.draw(st.integers(0, 3)),
        "reserve_after_s": data.draw(st.sampled_from([0.0, DAY])),
        "aging_s": data.draw(st.sampled_from([DAY, 4 * DAY])),
    }
    explained = schedule(queue, cluster, fair, NOW, PolicyConfig(explain=True, **options))
    silent = schedule(queue, cluster, fair, NOW, PolicyConfig(explain=False, **options))
    assert [(p.job_id, p.slots) for p in silent.placements] == [(p.job_id, p.slots) for p in explained.placements]
    assert silent.preempt == explained.preempt
    assert silent.pending == []


def test_a_second_high_job_preempts_with_or_without_reasons() -> None:
    cluster = Cluster(
        [HostCapacity("h0", [0.0, 0.0])],
        [RunningJob(100 + i, "b", 2, "h0", (i,), 1.0, NOW - 100 - i) for i in range(2)],
    )
    queue = [QueuedJob(i, "a", 0, 1, 1.0, NOW - 50 + i) for i in range(2)]
    decisions = [
        schedule(queue, cluster, FairShare(), NOW, PolicyConfig(preemption=True, explain=explain))
        for explain in (True, False)
    ]
    assert decisions[0].preempt == {100: 1, 101: 0} or decisions[0].preempt == {100: 0, 101: 1}
    assert decisions[1].preempt == decisions[0].preempt


def test_every_policy_is_one_object_of_the_registry_by_its_name() -> None:
    """fifo, fit-first and towerq are policies behind one interface (issue 45, part 4), found
    by name; `towerq simulate --policy` offers exactly those."""
    from service.cli.command import parser
    from service.scheduler.policy import POLICIES, Fifo, FitFirst, Towerq
    from service.scheduler.types import Policy

    assert {name: type(policy) for name, policy in POLICIES.items()} == {
        Policy.FIFO: Fifo,
        Policy.FIT_FIRST: FitFirst,
        Policy.TOWERQ: Towerq,
    }
    simulate = parser()._subparsers._group_actions[0].choices["simulate"]  # type: ignore[union-attr]
    choices = next(a.choices for a in simulate._actions if a.dest == "policy")
    assert sorted(choices) == sorted(POLICIES)
