"""Groups in the policy: two-level fair share (groups by their shares, then the users of each
group), GPU and GPU-hour quotas that hold a group's jobs back with a reason, and a lab
without groups ranked exactly as before."""

from __future__ import annotations

from service.scheduler.ranking import FairShareTerms, RankOrder
from service.scheduler.types import FairShare, PolicyConfig
from tests.service.scheduler.test_policy import NOW, cluster, job, placed, reasons, run, running

HOUR = 3600.0


def order(queued, fair: FairShare) -> list[int]:
    terms = FairShareTerms(fair, [], queued, NOW)
    return [j.id for j in RankOrder(queued, terms, NOW, PolicyConfig(), whole_host=8)]  # no slicing: unused


def test_groups_come_first_by_their_shares_then_users_within_a_group() -> None:
    # vision used 9 hours (frank, not waiting now), nlp 1 hour (all erin's). Flat, dave (who
    # used nothing) goes before erin; in the tree nlp is owed more than it had, so erin first.
    queued = [job(1, "dave", group="vision"), job(2, "erin", group="nlp")]
    usage = {"frank": 9 * HOUR, "erin": 1 * HOUR}
    groups = {"vision": 9 * HOUR, "nlp": 1 * HOUR}
    assert order([job(1, "dave"), job(2, "erin")], FairShare(usage=usage)) == [1, 2]
    assert order(queued, FairShare(usage=usage, group_usage=groups)) == [2, 1]
    # A share is a weight: at 20 to 1, vision's nine hours are under what it is owed.
    weighted = FairShare(usage=usage, group_usage=groups, group_shares={"vision": 20.0})
    assert order(queued, weighted) == [1, 2]


def test_within_a_group_users_are_ranked_by_their_own_shares_and_use() -> None:
    queued = [job(1, "alice", group="vision"), job(2, "bob", group="vision")]
    fair = FairShare(usage={"alice": 4 * HOUR, "bob": 1 * HOUR}, group_usage={"vision": 5 * HOUR})
    assert order(queued, fair) == [2, 1]
    fair.shares = {"alice": 10.0}
    assert order(queued, fair) == [1, 2]


def test_without_groups_the_terms_are_the_users_as_before() -> None:
    usage = {"alice": 3 * HOUR, "bob": 1 * HOUR, "carol": 0.0}
    queued = [job(i, user) for i, user in enumerate(["alice", "bob", "carol", "alice", "bob"], start=1)]
    terms = FairShareTerms(FairShare(usage=usage), [], queued, NOW)
    total = 4 * HOUR
    for user in ("alice", "bob", "carol"):
        assert terms.term(user) == terms.user_term(user)
        assert abs(terms.user_term(user) - (1 - 2 ** (-(usage[user] / total) / (1 / 3)))) < 1e-12
    # The one group's term is 0: the order is the users' alone.
    assert order(queued, FairShare(usage=usage)) == [3, 2, 5, 1, 4]


def test_a_group_at_its_gpu_quota_waits_saying_so_and_others_start() -> None:
    busy = [running(10, "lab-a", (0, 1), user="alice", group="vision")]
    fair = FairShare(group_limits={"vision": 2.0})
    d = run([job(1, "bob", group="vision"), job(2, "carol", group="nlp")], cluster(4, running=busy), fair_share=fair)
    assert set(placed(d)) == {2}
    assert reasons(d)[1] == "group quota: vision uses 2 of its 2 GPUs"
    # Jobs started in the same pass count against the quota too.
    d = run(
        [job(3, "bob", group="nlp"), job(4, "dave", group="nlp")],
        cluster(4),
        fair_share=FairShare(group_limits={"nlp": 1.5}),
    )
    assert len(placed(d)) == 1
    assert reasons(d)[4] == "group quota: nlp uses 1 of its 1.5 GPUs"


def test_a_group_over_its_weekly_hours_never_holds_gpus_against_one_within() -> None:
    # One GPU free; nlp's job is older and high priority, but nlp has used its hours.
    fair = FairShare(group_hours={"nlp": (40.5, 40.0), "vision": (3.0, 40.0)})
    queued = [job(1, "erin", priority=0, group="nlp", submitted=NOW - 5000, gpus=1), job(2, "dave", group="vision")]
    d = run(queued, cluster(1), fair_share=fair, explain=True)
    assert placed(d) == {2: ("lab-a", (0,))}
    assert reasons(d)[1] == "group quota: nlp used 40.5 of its 40 GPU hours in the last 7 days"


def test_the_rest_of_the_order_once_no_job_starts_is_the_order_the_merge_gives() -> None:
    """`RankOrder.rest`, the tail of a long queue in one sort, gives the jobs not yet given
    nor skipped in the order the account-by-account merge goes on in (the terms unchanged)."""
    users, groups = ["alice", "bob", "carol"], [None, "vision"]
    queued = [
        job(i, users[i % 3], gpus=(1, 2, 4)[i % 5 % 3], group=groups[i % 2], submitted=NOW - 7_000 * (i % 11) - i)
        for i in range(40)
    ]
    fair = FairShare(usage={"alice": 9 * HOUR, "carol": 2 * HOUR}, group_usage={"vision": 3 * HOUR})
    config = PolicyConfig(demote_after_gpu_s=HOUR)
    whole = list(RankOrder(queued, FairShareTerms(fair, [], queued, NOW), NOW, config, whole_host=8))
    partial = RankOrder(queued, FairShareTerms(fair, [], queued, NOW), NOW, config, whole_host=8)
    given = [j for _, j in zip(range(5), partial, strict=False)]
    given += [j for _, j in zip(range(7), partial, strict=False)]  # a second iteration goes on
    skip = {given[3].id, whole[20].id, whole[30].id}
    assert given == whole[:12]
    assert [j.id for j in partial.rest(skip)] == [j.id for j in whole[12:] if j.id not in skip]
