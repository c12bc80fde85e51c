"""`Pass.consider`'s memo: once nothing is free, a queued job of a shape already considered
takes that outcome, and every decision and reason stays what considering each job in full
gives."""

from __future__ import annotations

from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.scheduler import mechanics
from service.scheduler.policy import schedule
from service.scheduler.types import Cluster, FairShare, PolicyConfig, QueuedJob, RunningJob, Wait
from tests.service.scheduler.test_policy import NOW, cluster, job, running

# A queued job: each field of its shape from two or three values, and whether it has waited
# days (a starving gang takes a reservation). A queue is one such job and others that differ
# from it in one field each: many share a shape, and many differ in one field only (where
# the memo would go wrong if it left that field out).
JOBS = st.fixed_dictionaries(
    {
        "user": st.sampled_from(["a", "b", "c"]),
        "gpus": st.sampled_from([1, 2, 8]),
        "priority": st.sampled_from([0, 1, 2]),
        "fraction": st.sampled_from([1.0, 1.0, 0.5]),
        "group": st.sampled_from([None, "vision"]),
        "limit_s": st.sampled_from([None, 600.0]),
        "estimate_s": st.sampled_from([None, 900.0]),
        "typical_s": st.sampled_from([None, 300.0]),
        "served_gpu_s": st.sampled_from([0.0, 50_000.0]),
        "min_gpu_count": st.sampled_from([None, 1]),
        "host": st.sampled_from([None, None, "lab-b"]),
        "hosts": st.sampled_from([None, None, frozenset({"lab-a"})]),
        "old": st.booleans(),
    }
)
FIELDS = ["user", "gpus", "priority", "fraction", "group", "limit_s", "estimate_s", "typical_s"]
FIELDS += ["served_gpu_s", "min_gpu_count", "host", "hosts", "old"]
RUNNING = st.tuples(
    st.sampled_from([1, 2, 4, 8]),  # GPUs
    st.sampled_from(["a", "b", "c", "zed"]),
    st.sampled_from([1, 2]),  # priority
    st.booleans(),  # elastic
    st.booleans(),  # served long: time slicing may stop it
    st.sampled_from([None, 1_000.0, 100_000.0]),  # time limit
)


def queued_job(job_id: int, drawn: dict[str, object]) -> QueuedJob:
    values = dict(drawn)
    gpus, user, old = values.pop("gpus"), values.pop("user"), values.pop("old")
    if values["min_gpu_count"] is not None and (gpus == 1 or values["fraction"] != 1.0):
        values["min_gpu_count"] = None
    if values["fraction"] != 1.0:
        gpus = 1
    submitted = NOW - (3 * 86_400 if old else 10 * job_id)
    return job(job_id, str(user), gpus=gpus, submitted=submitted, **values)


def a_cluster(layout: list[tuple[int, str, int, bool, bool, float | None]], free: int) -> Cluster:
    """Two hosts of 8 GPUs, all held but `free` of lab-b's: each entry a running job (its
    GPUs clipped to what is left), the rest one rigid job per host."""
    jobs: list[RunningJob] = []
    left = {"lab-a": list(range(8)), "lab-b": list(range(8 - free))}
    hosts = iter(left)
    host = next(hosts)
    for n, (gpus, user, priority, elastic, served, limit) in enumerate(layout):
        if not left[host]:
            host = next(hosts, None)
            if host is None:
                break
        indices, left[host] = tuple(left[host][:gpus]), left[host][gpus:]
        extra = {"min_gpu_count": 1, "full_gpu_count": len(indices)} if elastic and len(indices) > 1 else {}
        started = NOW - (200_000 if served else 30 + n)
        jobs.append(
            running(900 + n, host, indices, user=user, priority=priority, started=started, limit_s=limit, **extra)
        )
    for host, indices in left.items():
        if indices:
            jobs.append(running(990 + len(jobs), host, tuple(indices), started=NOW - 100_000))
    return cluster(8, 8, running=jobs)


def decide(queue: list[QueuedJob], layout, free: int, config: PolicyConfig) -> str:
    fair = FairShare(usage={"a": 10_000.0, "b": 0.0, "c": 500.0, "zed": 1_000.0}, limits={"c": 4.0})
    return repr(schedule(queue, a_cluster(layout, free), fair, NOW, config))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    base=JOBS,
    changes=st.lists(st.tuples(st.sampled_from(FIELDS), JOBS), min_size=1, max_size=6),
    layout=st.lists(RUNNING, min_size=1, max_size=8),
    free=st.sampled_from([0, 0, 2]),
    config=st.sampled_from(
        [
            PolicyConfig(explain=True, demote_after_gpu_s=3_600.0),
            PolicyConfig(explain=True, preemption=True),
            PolicyConfig(explain=False, preemption=True, demote_after_gpu_s=3_600.0),
            PolicyConfig(explain=True),
        ]
    ),
)
def test_the_memo_changes_no_decision_and_no_reason(
    monkeypatch: pytest.MonkeyPatch, base, changes, layout, free: int, config: PolicyConfig
) -> None:
    queue = [queued_job(i, {**base, field: drawn[field]}) for i, (field, drawn) in enumerate(changes)]
    with_memo = decide(queue, layout, free, config)
    with monkeypatch.context() as patched:
        patched.setattr(mechanics, "SHAPE", lambda j: (j.id,))  # every job its own shape: no memo
        in_full = decide(queue, layout, free, config)
    assert with_memo == in_full


ONE = {"priority": 1, "fraction": 1.0, "group": None, "limit_s": None, "estimate_s": None, "typical_s": None}
SHAPE_OF = [
    {**ONE, "user": "a", "gpus": 1, "served_gpu_s": 0.0, "min_gpu_count": None, "host": None, "old": False},
    {**ONE, "user": "b", "gpus": 4, "served_gpu_s": 0.0, "min_gpu_count": 1, "host": None, "old": False},
    {**ONE, "user": "b", "gpus": 1, "served_gpu_s": 50_000.0, "min_gpu_count": None, "host": "lab-b", "old": False},
]


def test_a_long_queue_of_few_shapes_is_considered_in_full_only_a_few_times(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = [(8, "zed", 1, False, True, None), (8, "zed", 1, False, True, None)]
    queue = [queued_job(i, SHAPE_OF[i % 3]) for i in range(600)]
    in_full = []
    consider = mechanics.Pass._consider
    monkeypatch.setattr(mechanics.Pass, "_consider", lambda self, j: in_full.append(j.id) or consider(self, j))
    config = PolicyConfig(explain=True, demote_after_gpu_s=3_600.0)
    decision = schedule(queue, a_cluster(layout, 0), FairShare(), NOW, config)
    assert len(decision.pending) == 600 and not decision.placements
    assert len(in_full) < 20, f"{len(in_full)} of 600 jobs considered in full"


def test_the_shape_is_every_field_of_a_queued_job_but_its_id_and_submit_time() -> None:
    """A field added to `QueuedJob` must be added to `mechanics.SHAPE` too, or be shown not to
    change what considering a job comes to (as the submit time, which only ranks it)."""
    probe = QueuedJob(**{f.name: f.name for f in fields(QueuedJob)})  # type: ignore[arg-type]
    assert set(mechanics.SHAPE(probe)) == {f.name for f in fields(QueuedJob)} - {"id", "submitted"}


def full_pass(queue: list[QueuedJob], layout, config: PolicyConfig) -> mechanics.Pass:
    return mechanics.Pass(queue, a_cluster(layout, 0), FairShare(), NOW, config, stops_jobs=True)


def test_a_job_the_pass_reserves_for_is_considered_in_full_after_one_of_its_shape() -> None:
    layout = [(8, "zed", 1, False, False, 5_000.0), (8, "zed", 1, False, False, 9_000.0)]
    other, starving = job(1, "a", gpus=8), job(2, "a", gpus=8)
    scheduling = full_pass([other, starving], layout, PolicyConfig(explain=True))
    scheduling.reservable = {starving.id}
    scheduling.consider(other)
    scheduling.consider(starving)
    waits = {p.job_id: p for p in scheduling.decision.pending}
    assert waits[1].reserved_start is None
    assert waits[2].reserved_start == NOW - 30 + 5_000.0, "lab-a's job ends first: its GPUs are held for job 2"


def test_the_eldest_whole_host_job_may_slice_after_one_of_its_shape_could_not() -> None:
    layout = [(8, "zed", 1, False, True, None), (8, "zed", 1, False, True, None)]
    served = {"served_gpu_s": 50_000.0}
    other, eldest = job(1, "a", gpus=8, **served), job(2, "a", gpus=8, **served)
    scheduling = full_pass([other, eldest], layout, PolicyConfig(explain=True, demote_after_gpu_s=3_600.0))
    scheduling.eldest_gang = eldest.id
    scheduling.consider(other)
    scheduling.consider(eldest)
    assert set(scheduling.decision.preempt.values()) == {2}, "only the eldest slices work that had its slice"


def test_a_job_that_elastic_jobs_shrink_for_waits_for_them_after_one_of_its_shape() -> None:
    layout = [(8, "zed", 1, True, False, None), (8, "zed", 1, False, False, None)]
    cluster_ = a_cluster(layout, 0)
    shrinking = cluster_.running[0]
    shrinking.shrinking_for, shrinking.stopping = 2, True
    queue = [job(1, "a", gpus=4, submitted=NOW - 500), job(2, "a", gpus=4, submitted=NOW - 100)]
    decision = schedule(queue, cluster_, FairShare(), NOW, PolicyConfig(explain=True))
    kinds = {p.job_id: p.reason.kind for p in decision.pending}
    assert kinds[2] == Wait.SHRINKING and kinds[1] != Wait.SHRINKING, kinds
