"""`GET /api/usage` and `GET /api/fair-share`, on SQLite and PostgreSQL, from allocations
written with known times: exact GPU hours inside a window, jobs, waits; and the fair-share
terms the scheduler's policy gives the users present."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.db import Database
from service.core.models import Allocation, Gpu, Host, Job, JobEvent, JobState, User
from tests.service.api.conftest import Api

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def hours(n: float) -> datetime:
    return T0 + timedelta(hours=n)


def user_named(session: Session, name: str) -> User:
    owner = session.scalar(select(User).where(User.name == name))
    if owner is None:
        owner = User(name=name)
        session.add(owner)
        session.flush()
    return owner


def add_run(
    db: Database,
    user: str,
    host: str,
    indices: list[int],
    submitted: datetime,
    start: datetime,
    end: datetime | None,
    fraction: float = 1.0,
    group: str | None = None,
) -> int:
    """A job of `user` (in `group`) that waited from `submitted` to `start` and held GPUs
    until `end` (None: it still runs)."""
    with db.write() as session:
        owner = user_named(session, user)
        job = Job(
            name=f"{user}-run",
            user_id=owner.id,
            state=JobState.RUNNING if end is None else JobState.SUCCEEDED,
            spec={"model": "mlp", "dataset": "digits"},
            gpu_count=len(indices),
            gpu_memory_fraction=fraction,
            total_steps=10,
            attempts=1,
            created_at=submitted,
            host_name=host,
            group=group,
        )
        session.add(job)
        session.flush()
        host_row = session.scalar(select(Host).where(Host.name == host))
        assert host_row is not None
        for index in indices:
            gpu = session.scalar(select(Gpu).where(Gpu.host_id == host_row.id, Gpu.index == index))
            assert gpu is not None
            session.add(
                Allocation(
                    job_id=job.id,
                    attempt=1,
                    host_id=host_row.id,
                    gpu_id=gpu.id,
                    fraction=fraction,
                    created_at=start,
                    released_at=end,
                )
            )
        return job.id


def add_cluster_run(db: Database, user: str, gpus: int, events: list[tuple], group: str | None = None) -> int:
    """A job of `user` (in `group`) that an executor's cluster ran (no allocation rows), as its
    events say: (state, time, attempt[, message]); a `running` event's message names the node."""
    with db.write() as session:
        last = events[-1][0]
        job = Job(
            name=f"{user}-slurm",
            user_id=user_named(session, user).id,
            state=last,
            spec={"model": "mlp", "dataset": "digits"},
            gpu_count=gpus,
            total_steps=10,
            attempts=events[-1][2],
            created_at=events[0][1],
            started_at=next(at for state, at, *_ in events if state == "running"),
            finished_at=events[-1][1] if last in ("succeeded", "failed", "cancelled") else None,
            group=group,
        )
        session.add(job)
        session.flush()
        for state, at, attempt, *message in events:
            session.add(JobEvent(job_id=job.id, state=state, time=at, attempt=attempt, message=(message or [None])[0]))
        return job.id


@pytest.fixture
def lab(alice: Api, db: Database, add_host: Callable[..., None]) -> Api:
    """alice: 2 GPUs × 4 h (hours 0-4, waited 1 h), 1 GPU × 2 h (hours 10-12, waited 3 h);
    bob: half a GPU × 6 h on lab-b (hours 2-8, waited 0.5 h)."""
    add_host("lab-b", 2)
    add_run(db, "alice", "lab-a", [0, 1], hours(-1), hours(0), hours(4))
    add_run(db, "alice", "lab-a", [2], hours(7), hours(10), hours(12))
    add_run(db, "bob", "lab-b", [0], hours(1.5), hours(2), hours(8), fraction=0.5)
    return alice


def by_key(answer: dict) -> dict[str, dict]:
    return {row["key"]: row for row in answer["rows"]}


def test_usage_per_user_and_host_counts_exact_gpu_hours_inside_the_window(lab: Api) -> None:
    answer = lab.get("/api/usage", params={"since": hours(0).isoformat(), "until": hours(12).isoformat()})
    assert answer.status_code == 200, answer.text
    users = by_key(answer.json())
    assert users["alice"]["gpu_hours"] == pytest.approx(2 * 4 + 1 * 2)
    assert users["bob"]["gpu_hours"] == pytest.approx(0.5 * 6)
    assert (users["alice"]["jobs"], users["bob"]["jobs"]) == (2, 1)
    assert users["alice"]["started"] == 2 and users["alice"]["median_wait_s"] == pytest.approx(2 * 3600)
    assert users["alice"]["p95_wait_s"] == pytest.approx(3 * 3600)
    assert users["bob"]["median_wait_s"] == pytest.approx(1800)

    # A window cutting through runs counts only the part inside it: hours 3-9.
    cut = by_key(lab.get("/api/usage", params={"since": hours(3).isoformat(), "until": hours(9).isoformat()}).json())
    assert cut["alice"]["gpu_hours"] == pytest.approx(2 * 1)
    assert cut["bob"]["gpu_hours"] == pytest.approx(0.5 * 5)
    assert cut["alice"]["started"] == 0 and cut["alice"]["median_wait_s"] is None  # started before the window

    hosts = by_key(
        lab.get(
            "/api/usage", params={"since": hours(0).isoformat(), "until": hours(12).isoformat(), "by": "host"}
        ).json()
    )
    assert hosts["lab-a"]["gpu_hours"] == pytest.approx(10) and hosts["lab-b"]["gpu_hours"] == pytest.approx(3)
    assert hosts["lab-a"]["jobs"] == 2 and hosts["lab-b"]["started"] == 1


def test_a_running_job_counts_up_to_now(lab: Api, db: Database) -> None:
    now = datetime.now(UTC)
    add_run(db, "carol", "lab-b", [1], now - timedelta(hours=3), now - timedelta(hours=2), None)
    rows = by_key(lab.get("/api/usage", params={"since": (now - timedelta(days=1)).isoformat()}).json())
    assert rows["carol"]["gpu_hours"] == pytest.approx(2.0, abs=0.01)


def test_attempts_slurm_placed_count_from_their_events_on_their_nodes(lab: Api, db: Database) -> None:
    """No allocation rows on Slurm: dave's 2-GPU job ran hours 1-3 on node7, went back to the
    queue (its node failed), ran again hours 5-6 on node8 and succeeded; erin's 1-GPU job
    still runs on node7 since hour 11."""
    add_cluster_run(
        db, "dave", 2,
        [("queued", hours(0.5), 1), ("dispatched", hours(0.5), 1), ("running", hours(1), 1, "pid 7 on node7"),
         ("queued", hours(3), 2), ("dispatched", hours(3), 2), ("running", hours(5), 2, "pid 9 on node8"),
         ("succeeded", hours(6), 2)],
    )  # fmt: skip
    add_cluster_run(
        db,
        "erin",
        1,
        [("queued", hours(10), 1), ("dispatched", hours(10), 1), ("running", hours(11), 1, "pid 3 on node7")],
    )
    window = {"since": hours(0).isoformat(), "until": hours(12).isoformat()}
    users = by_key(lab.get("/api/usage", params=window).json())
    assert users["dave"]["gpu_hours"] == pytest.approx(2 * 2 + 2 * 1)
    assert users["dave"]["jobs"] == 1 and users["dave"]["started"] == 1
    assert users["dave"]["median_wait_s"] == pytest.approx(0.5 * 3600)  # submit to its first start only
    assert users["erin"]["gpu_hours"] == pytest.approx(1)  # up to the window's end
    assert users["alice"]["gpu_hours"] == pytest.approx(2 * 4 + 1 * 2)  # allocations count as before
    hosts = by_key(lab.get("/api/usage", params={**window, "by": "host"}).json())
    assert hosts["node7"]["gpu_hours"] == pytest.approx(2 * 2 + 1) and hosts["node7"]["jobs"] == 2
    assert hosts["node8"]["gpu_hours"] == pytest.approx(2)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": hours(5).isoformat(), "until": hours(1).isoformat()}, "since"),
        ({"by": "gpu"}, "by"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-11-01T00:00:00"}, "until"),
    ],
)
def test_bad_usage_queries_name_their_field(lab: Api, params: dict[str, str], field: str) -> None:
    answer = lab.get("/api/usage", params=params)
    assert answer.status_code == 422, answer.text
    assert field in answer.text


def test_fair_share_shows_each_present_users_term_as_the_policy_ranks_them(lab: Api, db: Database) -> None:
    """Users with usage but nothing queued or running have no term; of two users with jobs
    waiting, the one who used less lately ranks first (the lower term)."""
    now = datetime.now(UTC)
    add_run(db, "carol", "lab-b", [1], now - timedelta(hours=2), now - timedelta(hours=1), None)  # running
    add_run(db, "erin", "lab-b", [0], now - timedelta(hours=5), now - timedelta(hours=4), now - timedelta(hours=3))
    add_run(db, "alice", "lab-a", [0], now - timedelta(hours=5), now - timedelta(hours=4), now - timedelta(hours=3))
    for user in ("alice", "dave"):
        lab_user_queued(db, user)
    answer = lab.get("/api/fair-share")
    assert answer.status_code == 200, answer.text
    users = {row["user"]: row for row in answer.json()["users"]}
    assert users["erin"]["term"] is None and users["erin"]["usage_gpu_hours"] > 0  # used, not present
    assert "bob" not in users  # three weeks ago: decayed out of the scheduler's history
    assert users["dave"]["usage_gpu_hours"] == 0 and users["dave"]["term"] == 0.0  # nothing used: first
    assert 0 < users["alice"]["term"] < 1 and users["alice"]["queued_jobs"] == 1
    assert users["carol"]["running_gpus"] == 1 and users["carol"]["term"] > users["dave"]["term"]
    assert sum(users[u]["owed"] for u in ("alice", "carol", "dave")) == pytest.approx(1.0)


def lab_user_queued(db: Database, user: str) -> None:
    with db.write() as session:
        owner = user_named(session, user)
        session.add(
            Job(
                name=f"{user}-waiting",
                user_id=owner.id,
                state=JobState.QUEUED,
                spec={"model": "mlp", "dataset": "digits"},
                gpu_count=1,
                total_steps=10,
            )
        )


def test_the_timelines_queue_counts_a_job_a_cluster_ran_as_waiting_only_until_it_started(
    lab: Api, db: Database
) -> None:
    """A Slurm job has no allocation rows: it waited until its first `running` event, not
    until it ended (the queue chart showed it waiting while it ran)."""
    add_cluster_run(db, "carol", 1, [("queued", hours(13), 1), ("running", hours(14), 1, "on node-1"),
                                     ("succeeded", hours(16), 1)])  # fmt: skip
    body = lab.get("/api/usage/timeline", params={"since": hours(-2).isoformat(), "until": hours(18).isoformat()})
    queue = {datetime.fromisoformat(q["time"]): q for q in body.json()["queue"]}
    assert queue[hours(13.5)]["queued"] == 1 and queue[hours(15)]["queued"] == 0
    assert [(q["started"], q["median_wait_s"]) for q in body.json()["queue"] if q["started"]][-1] == (1, 3600)


def test_the_timeline_lists_every_allocation_and_the_queue_over_time(lab: Api) -> None:
    answer = lab.get("/api/usage/timeline", params={"since": hours(-2).isoformat(), "until": hours(18).isoformat()})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    held = sorted((a["user"], a["host"], a["gpu"], a["fraction"]) for a in body["allocations"])
    assert held == [("alice", "lab-a", 0, 1.0), ("alice", "lab-a", 1, 1.0), ("alice", "lab-a", 2, 1.0),
                    ("bob", "lab-b", 0, 0.5)]  # fmt: skip
    queue = {datetime.fromisoformat(q["time"]): q for q in body["queue"]}
    assert len(queue) == 201
    assert queue[hours(-0.5)]["queued"] == 1  # alice's first job, submitted at -1, started at 0
    assert queue[hours(1.7)]["queued"] == 1 and queue[hours(8)]["queued"] == 1  # bob's; alice's second
    assert queue[hours(9)]["queued"] == 1 and queue[hours(12)]["queued"] == 0
    started = [q for q in body["queue"] if q["started"]]
    assert [(q["started"], q["median_wait_s"]) for q in started] == [(1, 3600), (1, 1800), (1, 3 * 3600)]


def test_how_busy_the_gpus_were_is_each_jobs_sampled_share_weighted_by_its_gpu_hours(lab: Api, db: Database) -> None:
    """alice's 8 GPU hours were 20 % busy and her 2 later ones 70 %: 30 % over her 10; bob's
    job was never sampled (simulated GPUs): no figure, rather than 0."""
    with db.write() as session:
        first, later = session.scalars(select(Job).join(User).where(User.name == "alice").order_by(Job.id)).all()
        for job, busy in ((first, 20.0), (later, 70.0)):
            use = {"rank": 0, "gpus": job.gpu_count, "samples": 5, "busy_pct": busy, "memory_peak_mb": 100}
            job.gpu_use = {"1.0": {**use, "memory_total_mb": 81559}}
    users = by_key(lab.get("/api/usage", params={"since": hours(0).isoformat(), "until": hours(12).isoformat()}).json())
    assert (users["alice"]["gpu_busy_pct"], users["alice"]["sampled_gpu_hours"]) == (30.0, pytest.approx(10))
    assert (users["bob"]["gpu_busy_pct"], users["bob"]["sampled_gpu_hours"]) == (None, 0.0)
