"""Groups over the API (SQLite and PostgreSQL): admins create them and put users in them;
a job runs in the group it names (its owner must belong) or its owner's default; quotas and
shares show in the fair-share tree and usage by group; a scheduling pass holds a group at
its quota with the reason in words."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import update

from service.core.context import Context
from service.core.db import Database
from service.core.models import JobState, User, utcnow
from service.core.settings import Settings
from service.scheduler.live import LiveScheduler
from service.scheduler.usage import interval_usage
from tests.service.api.conftest import Api
from tests.service.api.test_usage import add_cluster_run, add_run

SPEC: dict[str, Any] = {"model": "mlp", "dataset": "digits", "hyperparameters": {"steps": 5}}


def one_pass(settings: Settings) -> None:
    """One scheduling pass, as the scheduler process runs them."""
    ctx = Context.open(settings)
    try:
        LiveScheduler(ctx).run_pass()
    finally:
        ctx.close()


def test_admins_manage_groups_and_everyone_reads_them(alice: Api, as_user: Callable[..., Api]) -> None:
    admin = as_user("root", admin=True)
    made = admin.post("/api/groups", json={"name": "vision", "share": 2, "max_gpus": 4})
    assert made.status_code == 201, made.text
    assert made.json() | {"created_at": None} == {
        "name": "vision",
        "share": 2.0,
        "max_gpus": 4.0,
        "max_gpu_hours_week": None,
        "gpu_hours_week": 0.0,
        "members": [],
        "created_at": None,
    }
    assert alice.post("/api/groups", json={"name": "mine"}).status_code == 403
    again = admin.post("/api/groups", json={"name": "vision"})
    assert again.status_code == 409 and "exists already" in again.text
    for bad in ({"name": "Vision"}, {"name": "x", "share": 0}, {"name": "x", "max_gpus": -1}, {"name": "x", "y": 1}):
        answer = admin.post("/api/groups", json=bad)
        assert answer.status_code == 422, bad
        assert next(iter(bad.keys() - {"name"}), "name") in answer.text

    admin.post("/api/groups", json={"name": "nlp"})
    assert admin.put("/api/groups/vision/members/alice", json={}).status_code == 200
    assert admin.put("/api/groups/nlp/members/alice", json={"default": True}).json()["members"] == [
        {"user": "alice", "default": True}
    ]
    assert admin.put("/api/groups/nlp/members/nobody", json={}).status_code == 404
    assert alice.put("/api/groups/nlp/members/alice", json={}).status_code == 403
    listed = alice.get("/api/groups").json()
    assert [(g["name"], g["members"]) for g in listed] == [
        ("nlp", [{"user": "alice", "default": True}]),
        ("vision", [{"user": "alice", "default": False}]),
    ]

    changed = admin.patch("/api/groups/vision", json={"share": 3, "max_gpus": None, "max_gpu_hours_week": 100})
    assert (changed.json()["share"], changed.json()["max_gpus"], changed.json()["max_gpu_hours_week"]) == (
        3.0,
        None,
        100.0,
    )
    assert admin.delete("/api/groups/vision/members/alice").json()["members"] == []
    assert admin.delete("/api/groups/vision/members/alice").status_code == 404


def test_a_job_runs_in_the_group_it_names_or_its_owners_default(
    alice: Api, as_user: Callable[..., Api], db: Database
) -> None:
    admin = as_user("root", admin=True)
    plain = alice.post("/api/jobs", json=SPEC)
    assert plain.json()["group"] is None  # no group yet: none
    for name in ("vision", "nlp"):
        admin.post("/api/groups", json={"name": name})
    admin.put("/api/groups/vision/members/alice", json={})
    only = alice.post("/api/jobs", json=SPEC).json()
    assert (only["group"], only["spec"]["group"]) == ("vision", "vision")  # their only group
    admin.put("/api/groups/nlp/members/alice", json={"default": True})
    assert alice.post("/api/jobs", json=SPEC).json()["group"] == "nlp"  # their default
    assert alice.post("/api/jobs", json={**SPEC, "group": "vision"}).json()["group"] == "vision"

    bob = as_user("bob")
    refused = bob.post("/api/jobs", json={**SPEC, "group": "vision"})
    assert refused.status_code == 422 and "group" in refused.text and "not a member of 'vision'" in refused.text
    missing = alice.post("/api/jobs", json={**SPEC, "group": "robots"})
    assert missing.status_code == 422 and "there is no group 'robots'" in missing.text
    assert alice.post("/api/jobs", json={**SPEC, "group": "NLP"}).status_code == 422

    queued = alice.get("/api/jobs").json()["items"]
    held = admin.delete("/api/groups/vision")
    assert held.status_code == 409 and "waiting or running" in held.text
    for job in queued:
        alice.post(f"/api/jobs/{job['id']}/cancel")
    assert admin.delete("/api/groups/vision").status_code == 204
    assert alice.get(f"/api/jobs/{only['id']}").json()["group"] == "vision"  # history keeps the name


def test_the_fair_share_tree_and_usage_by_group(
    alice: Api, as_user: Callable[..., Api], db: Database, add_host: Callable[..., None]
) -> None:
    admin = as_user("root", admin=True)
    assert alice.get("/api/fair-share").json()["groups"] == []  # a lab without groups
    admin.post("/api/groups", json={"name": "vision", "share": 3, "max_gpu_hours_week": 10})
    admin.post("/api/groups", json={"name": "nlp"})
    for user, group in (("alice", "vision"), ("bob", "nlp")):
        as_user(user)
        admin.put(f"/api/groups/{group}/members/{user}", json={})
    now = utcnow()
    add_run(db, "alice", "lab-a", [0, 1], now - timedelta(hours=3), now - timedelta(hours=3), now - timedelta(hours=1),
            group="vision")  # fmt: skip
    add_run(db, "bob", "lab-a", [2], now - timedelta(hours=1), now - timedelta(hours=1), None, group="nlp")
    add_run(db, "carol", "lab-a", [3], now - timedelta(days=9), now - timedelta(days=9), now - timedelta(days=8))
    alice.post("/api/jobs", json=SPEC)

    tree = alice.get("/api/fair-share").json()
    groups = {g["group"]: g for g in tree["groups"]}
    assert set(groups) == {"vision", "nlp", None}  # None: carol's old run, in no group
    assert groups[None]["term"] is None  # nothing of it waits or runs
    assert abs(groups["vision"]["gpu_hours_week"] - 4.0) < 0.01  # 2 GPUs for 2 hours
    assert groups["vision"]["max_gpu_hours_week"] == 10
    assert (groups["vision"]["owed"], groups["nlp"]["owed"]) == (0.75, 0.25)
    assert groups["vision"]["queued_jobs"] == 1 and groups["nlp"]["running_gpus"] == 1
    users = {(u["user"], u["group"]): u for u in tree["users"]}
    mine = users[("alice", "vision")]
    assert mine["owed"] == 1.0  # the only user of vision present
    own = 1 - 2 ** (-mine["used"] / mine["owed"])
    assert abs(mine["term"] - (groups["vision"]["term"] + own) / 2) < 1e-9  # the mean of the group's and hers
    assert users[("carol", None)]["term"] is None  # not waiting or running: no term

    since = (now - timedelta(days=10)).isoformat()
    rows = {r["key"]: r for r in alice.get("/api/usage", params={"by": "group", "since": since}).json()["rows"]}
    assert set(rows) == {"vision", "nlp", "(no group)"}
    assert abs(rows["vision"]["gpu_hours"] - 4.0) < 0.01 and abs(rows["(no group)"]["gpu_hours"] - 24.0) < 0.01


def test_what_a_slurm_cluster_ran_counts_in_quotas_and_fair_share_as_in_the_usage_report(
    settings: Settings, alice: Api, as_user: Callable[..., Api], db: Database
) -> None:
    """A Slurm cluster's attempts have no allocation rows. The usage report counted them from
    their events, but a group's GPU hours this week and the fair-share usage read allocation
    rows only: a group that ran on Slurm used nothing of its weekly quota."""
    admin = as_user("root", admin=True)
    admin.post("/api/groups", json={"name": "vision", "max_gpu_hours_week": 10})
    as_user("dave")
    admin.put("/api/groups/vision/members/dave", json={})
    now = utcnow()
    add_cluster_run(
        db, "dave", 2,
        [("queued", now - timedelta(hours=4), 1), ("running", now - timedelta(hours=3), 1, "pid 7 on node7"),
         ("queued", now - timedelta(hours=2), 2), ("running", now - timedelta(hours=1), 2, "pid 9 on node8")],
        group="vision",
    )  # fmt: skip
    since = (now - timedelta(days=1)).isoformat()
    rows = {r["key"]: r for r in alice.get("/api/usage", params={"by": "group", "since": since}).json()["rows"]}
    assert abs(rows["vision"]["gpu_hours"] - 4.0) < 0.02  # 2 GPUs for an hour, and for the last hour
    tree = alice.get("/api/fair-share").json()
    vision = {g["group"]: g for g in tree["groups"]}["vision"]
    assert abs(vision["gpu_hours_week"] - 4.0) < 0.02, vision
    assert abs(alice.get("/api/groups/vision").json()["gpu_hours_week"] - 4.0) < 0.02
    dave = {u["user"]: u for u in tree["users"]}["dave"]
    t, hour, half_life = now.timestamp(), 3600, settings.fair_share_half_life_s
    decayed = interval_usage(2, t - 3 * hour, t - 2 * hour, t, half_life) + interval_usage(2, t - hour, t, t, half_life)
    assert abs(dave["usage_gpu_hours"] - decayed / 3600) < 0.01, dave


def test_a_pass_holds_a_group_at_its_quotas_and_says_which(
    settings: Settings, alice: Api, as_user: Callable[..., Api], db: Database
) -> None:
    admin = as_user("root", admin=True)
    admin.post("/api/groups", json={"name": "vision", "max_gpus": 1})
    admin.post("/api/groups", json={"name": "nlp", "max_gpu_hours_week": 2})
    bob = as_user("bob")
    admin.put("/api/groups/vision/members/alice", json={})
    admin.put("/api/groups/nlp/members/bob", json={})
    now = utcnow()
    add_run(db, "bob", "lab-a", [0, 1], now - timedelta(hours=2), now - timedelta(hours=2), now - timedelta(hours=1),
            group="nlp")  # fmt: skip
    ids = [alice.post("/api/jobs", json=SPEC).json()["id"] for _ in range(2)]
    bobs = bob.post("/api/jobs", json=SPEC).json()["id"]
    one_pass(settings)
    states = {i: alice.get(f"/api/jobs/{i}").json() for i in [*ids, bobs]}
    assert [states[i]["state"] for i in ids] == [JobState.DISPATCHED, JobState.QUEUED]
    assert states[ids[1]]["pending_reason"] == "group quota: vision uses 1 of its 1 GPUs"
    assert states[bobs]["state"] == JobState.QUEUED
    assert states[bobs]["pending_reason"] == "group quota: nlp used 2.0 of its 2 GPU hours in the last 7 days"
    dry = bob.post("/api/jobs", params={"dry_run": "true"}, json=SPEC).json()
    assert dry["starts_now"] is False and dry["reason"].startswith("group quota: nlp used 2.0")
    admin.patch("/api/groups/nlp", json={"max_gpu_hours_week": 3})
    one_pass(settings)
    assert alice.get(f"/api/jobs/{bobs}").json()["state"] == JobState.DISPATCHED


def test_a_sweep_in_a_group_you_are_not_in_stores_nothing(alice: Api, as_user: Callable[..., Api]) -> None:
    """The group (and `after`) are checked for every setting before the sweep is stored: a
    refusal used to come after the sweep's row, leaving a sweep with no jobs."""
    admin = as_user("root", admin=True)
    admin.post("/api/groups", json={"name": "vision"})
    body = {"name": "s", "base": {**SPEC, "group": "vision"}, "grid": {"hyperparameters.seed": [1, 2]}}
    refused = alice.post("/api/sweeps", json=body)
    assert refused.status_code == 422 and "settings.0.group" in refused.text, refused.text
    impossible = alice.post("/api/sweeps", json={**body, "base": {**SPEC, "after": [999]}})
    assert impossible.status_code == 422 and "settings.0.after" in impossible.text, impossible.text
    assert alice.get("/api/sweeps").json()["items"] == [] and alice.get("/api/jobs").json()["total"] == 0
    admin.put("/api/groups/vision/members/alice", json={})
    made = alice.post("/api/sweeps", json=body)
    assert made.status_code == 201, made.text
    assert {alice.get(f"/api/jobs/{j['id']}").json()["group"] for j in made.json()["jobs"]} == {"vision"}


def test_a_job_over_its_groups_gpu_quota_could_never_start_and_is_refused(
    alice: Api, as_user: Callable[..., Api]
) -> None:
    """Accepted, it waited for ever ("group quota: vision uses 0 of its 2 GPUs")."""
    admin = as_user("root", admin=True)
    admin.post("/api/groups", json={"name": "vision", "max_gpus": 2})
    admin.put("/api/groups/vision/members/alice", json={})
    four = {**SPEC, "gpu_count": 4}
    for params in ({}, {"dry_run": "true"}):
        refused = alice.post("/api/jobs", params=params, json=four)
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"][0]
        assert detail["loc"][-1] == "gpu_count"
        assert detail["msg"] == (
            "gpu_count: group vision may hold at most 2 GPUs at once (its quota); this job asks 4 GPUs, so it could "
            "never start: ask for fewer, or an admin raises the quota (towerq group set)"
        )
    shared = alice.post("/api/jobs", json={**four, "gpu_memory_fraction": 0.5})
    assert shared.status_code == 201, "4 GPUs at half each hold 2"
    sweep = {"name": "s", "base": four, "grid": {"hyperparameters.seed": [1, 2]}, "metric": "loss"}
    refused = alice.post("/api/sweeps", json=sweep)
    assert refused.status_code == 422 and "could never start" in refused.text, refused.text
    assert alice.get("/api/sweeps").json()["items"] == []
    assert alice.post("/api/jobs", json={**SPEC, "gpu_count": 2}).status_code == 201


def test_a_job_over_its_owners_gpu_limit_is_refused(settings: Settings, alice: Api, db: Database) -> None:
    with db.write() as session:
        session.execute(update(User).where(User.name == "alice").values(gpu_limit=1))
    refused = alice.post("/api/jobs", json={**SPEC, "gpu_count": 2})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["msg"].startswith(
        "gpu_count: alice may hold at most 1 GPU at once (their limit)"
    )


def test_an_idle_lab_shows_each_member_under_their_group(alice: Api, as_user: Callable[..., Api], db: Database) -> None:
    """Nothing runs or waits: members with usage used to show under "[no group]"."""
    admin = as_user("root", admin=True)
    admin.post("/api/groups", json={"name": "vision"})
    admin.post("/api/groups", json={"name": "nlp"})
    as_user("bob")
    admin.put("/api/groups/vision/members/alice", json={})
    for group in ("vision", "nlp"):  # bob is in two, nlp his default
        admin.put(f"/api/groups/{group}/members/bob", json={"default": group == "nlp"})
    now = utcnow()
    for user in ("alice", "bob"):
        add_run(db, user, "lab-a", [0], now - timedelta(hours=3), now - timedelta(hours=3), now - timedelta(hours=2))
    users = {u["user"]: u["group"] for u in alice.get("/api/fair-share").json()["users"]}
    assert users == {"alice": "vision", "bob": "nlp"}
