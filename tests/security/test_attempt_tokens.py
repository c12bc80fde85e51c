"""An attempt's token (`/api/attempts`, what a Slurm node's batch script holds instead of
the database's and Redis' credentials) reaches that one attempt of that one job while it
runs, and nothing else: not another job's attempt, not its own job's next attempt, not
after its end or a newer submission's token, not a member's routes; its reports set only
the job's figures, its live messages are only its own points and lines, it drains only
the GPUs its attempt was given, and the door it records, only a notebook session's, is on
its own node and a rank port: never another service the API's proxy would connect to."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.core import keys
from service.core.attempts import mint_attempt_token
from service.core.context import Context
from service.core.models import Gpu, Host, Job, JobState, Notification, RankAddress
from service.core.settings import Settings
from service.jobs.submit import submit
from service.lab.auth import Caller, ensure_user
from service.scheduler.live import LiveScheduler
from towerq.contract.messages import LogMessage, StateMessage, encode
from towerq.contract.spec import JobSpec

NOW = datetime.now(UTC).isoformat()
LINE = {"time": NOW, "level": "info", "message": "hello"}
ROUTES = [
    ("GET", "", None),
    ("GET", "/stored", None),
    ("GET", "/rungs", None),
    ("POST", "/running", {"pid": 1, "cuda_visible_devices": "0", "artifacts_dir": "/a"}),
    ("POST", "/reports", {"logs": [LINE]}),
    ("POST", "/publish", {"messages": []}),
    ("POST", "/forget", {"step": 0}),
    ("POST", "/end", {"ending": "succeeded"}),
    ("POST", "/drain", {"host": "lab-a", "indices": [0]}),
    ("POST", "/door", {"address": "lab-a:29400", "key": "ab" * 32}),
    ("DELETE", "/door", None),
]


@pytest.fixture
def ctx(settings: Settings, add_host: Callable[..., None]) -> Iterator[Context]:
    add_host("lab-a", 2)
    context = Context.open(settings)
    yield context
    context.close()


def dispatched(ctx: Context, user: str, gpu: int, kind: str = "model") -> int:
    with ctx.db.write() as session:
        owner = ensure_user(session, user)
        caller = Caller(owner.id, owner.name, False, 0)
    what = {"kind": "notebook"} if kind == "notebook" else {"model": "mlp", "dataset": "digits"}
    spec = JobSpec.model_validate({**what, "gpus": [gpu]})
    job_id = submit(ctx.db, caller, spec, ctx.settings)[0].id
    LiveScheduler(ctx).run_pass()
    return job_id


def token_of(ctx: Context, job_id: int, attempt: int = 1) -> str:
    with ctx.db.write() as session:
        return mint_attempt_token(session, job_id, attempt)


def call(client: TestClient, token: str, method: str, path: str, body: dict | None) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return client.request(method, path, json=body, headers=headers).status_code


def state_of(ctx: Context, job_id: int) -> str:
    with ctx.db.read() as session:
        return str(session.scalar(select(Job.state).where(Job.id == job_id)))


def test_a_token_reaches_its_own_attempt_only(ctx: Context, client: TestClient, make_token: Callable[..., str]) -> None:
    mine, theirs = dispatched(ctx, "alice", 0), dispatched(ctx, "bob", 1)
    token = token_of(ctx, mine)
    token_of(ctx, theirs)
    for method, path, body in ROUTES:
        for job_id, attempt in ((theirs, 1), (mine, 2), (mine, 0), (mine + 1000, 1)):
            refused = call(client, token, method, f"/api/attempts/{job_id}/{attempt}{path}", body)
            assert refused in (401, 422), (method, path, job_id, attempt, refused)
    assert state_of(ctx, theirs) == JobState.DISPATCHED
    assert call(client, token, "GET", f"/api/attempts/{mine}/1", None) == 200
    # a member's own API token (an admin's too) is no attempt's token, and the other way round
    for member in (make_token("alice"), make_token("root", True)):
        assert call(client, member, "POST", f"/api/attempts/{mine}/1/end", {"ending": "succeeded"}) == 401
    assert call(client, token, "GET", "/api/jobs", None) == 401
    assert state_of(ctx, mine) == JobState.DISPATCHED


def test_a_token_is_refused_once_its_attempt_ended_or_was_submitted_again(ctx: Context, client: TestClient) -> None:
    job_id = dispatched(ctx, "alice", 0)
    first = token_of(ctx, job_id)
    second = token_of(ctx, job_id)  # the attempt submitted again (Slurm lost it): a new token
    assert call(client, first, "GET", f"/api/attempts/{job_id}/1", None) == 401
    assert call(client, second, "POST", f"/api/attempts/{job_id}/1/end", {"ending": "failed", "message": "x"}) == 204
    assert state_of(ctx, job_id) == JobState.FAILED
    for method, path, body in ROUTES:
        assert call(client, second, method, f"/api/attempts/{job_id}/1{path}", body) == 401, (method, path)


def test_a_report_sets_only_the_jobs_figures(ctx: Context, client: TestClient) -> None:
    job_id = dispatched(ctx, "alice", 0)
    token = token_of(ctx, job_id)
    path = f"/api/attempts/{job_id}/1/reports"
    for fields in ({"state": "succeeded"}, {"user_id": 2}, {"gpu_memory_fraction": 0.1}, {"attempt_token_hash": "0"}):
        assert call(client, token, "POST", path, {"fields": fields}) == 422, fields
    later = {"attempt": 2, "step": 1, "split": "train", "time": NOW}
    assert call(client, token, "POST", path, {"metrics": [later]}) == 422, "a point of a later attempt"
    assert call(client, token, "POST", path, {"log_bytes": -1}) == 422
    for folder_bytes in (-1, 21078812327710643334414336, 2**50 + 1):  # the second, past 64 bits: once a 500
        assert call(client, token, "POST", path, {"fields": {"folder_bytes": folder_bytes}}) == 422, folder_bytes
    found = {  # what schemathesis sent when it found the 500, but its folder_bytes: stored
        "batch_norm": {",\U00015dc7\u00a9\u00b8\u0090": [], "": ["then"], "6": []},
        "eval_loss": -5.2204688728093736e16,
        "step_at": "3209-05-28T08:05:35.192984-02:07",
        "examples_per_sec": -4.810617305063777e127,
    }
    assert call(client, token, "POST", path, {"fields": found}) == 204
    for edge in ("0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00"):  # no UTC time: once a 500
        for body in (
            {"metrics": [{**later, "attempt": 1, "time": edge}]},
            {"logs": [{**LINE, "time": edge}]},
            {"fields": {"step_at": edge}},
        ):
            assert call(client, token, "POST", path, body) == 422, body
    assert call(client, token, "POST", path, {"fields": {"step": 7, "loss": 0.5}, "log_bytes": 10}) == 204
    with ctx.db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert (job.state, job.step, job.loss, job.user_id) == (JobState.DISPATCHED, 7, 0.5, 1)
    # its GPU use: bounded, one entry per rank of this attempt, never another attempt's
    use = {"rank": 0, "gpus": 1, "samples": 3, "busy_pct": 40.0, "memory_peak_mb": 900, "memory_total_mb": 81559}
    for bad in ({"busy_pct": 100.5}, {"rank": 1024}, {"samples": 0}, {"memory_peak_mb": -1}, {"attempt": 2}):
        assert call(client, token, "POST", path, {"fields": {"gpu_use": {**use, **bad}}}) == 422, bad
    assert call(client, token, "POST", path, {"fields": {"gpu_use": use}}) == 204
    with ctx.db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.gpu_use == {"1.0": {**use, "idle_since": None, "idle_stop_since": None}}, (
            job.gpu_use
        )  # as the contract's


def test_reports_forged_idle_and_busy_in_turn_do_not_flood_the_labs_webhook(ctx: Context, client: TestClient) -> None:
    """A Slurm node's supervisor is the member's: reports that say its GPUs went idle, busy,
    idle again as fast as it likes owe one `job.idle` a warning time, not one each (a real
    idle stretch lasts the warning time before it is told)."""
    job_id = dispatched(ctx, "alice", 0)
    token = token_of(ctx, job_id)
    path = f"/api/attempts/{job_id}/1"
    assert (
        call(client, token, "POST", f"{path}/running", {"pid": 1, "cuda_visible_devices": "0", "artifacts_dir": "/a"})
        == 204
    )
    use = {"rank": 0, "gpus": 1, "samples": 3, "busy_pct": 1.0, "memory_peak_mb": 900, "memory_total_mb": 81559}
    for _ in range(20):
        for since in (NOW, None):
            assert (
                call(client, token, "POST", f"{path}/reports", {"fields": {"gpu_use": {**use, "idle_since": since}}})
                == 204
            )
    with ctx.db.read() as session:
        owed = session.scalars(select(Notification.event).where(Notification.job_id == job_id)).all()
    assert owed == ["job.idle"], owed  # the lab's webhook, once


def test_live_messages_are_only_the_attempts_own_points_and_lines(ctx: Context, client: TestClient) -> None:
    job_id, other = dispatched(ctx, "alice", 0), dispatched(ctx, "bob", 1)
    token = token_of(ctx, job_id)
    path = f"/api/attempts/{job_id}/1/publish"
    own = encode(LogMessage(job_id=job_id, attempt=1, level="info", message="hi", time=datetime.now(UTC)))
    forged = [
        encode(
            StateMessage(job_id=job_id, attempt=1, state="succeeded", message="done", time=datetime.now(UTC))
        ),  # the job page believes it
        encode(LogMessage(job_id=other, attempt=1, level="error", message="bob's job", time=datetime.now(UTC))),
        encode(LogMessage(job_id=job_id, attempt=2, level="info", message="next", time=datetime.now(UTC))),
        f'{{"type": "cancel", "job_id": {job_id}, "attempt": 1}}',
        "not json",
    ]
    with ctx.redis.pubsub() as pubsub:
        pubsub.subscribe(keys.job_channel(job_id), keys.job_channel(other))
        for payload in forged:
            assert call(client, token, "POST", path, {"messages": [own, payload]}) == 422, payload
        assert call(client, token, "POST", path, {"messages": [own]}) == 204
        got, deadline = [], time.monotonic() + 5
        while time.monotonic() < deadline and len(got) < 3:
            message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if message is not None:
                got.append(message["data"].decode())
    assert got == [own], "only the one valid batch, and nothing of a refused one"


def test_it_drains_only_the_gpus_its_attempt_was_given(ctx: Context, client: TestClient) -> None:
    job_id = dispatched(ctx, "alice", 0)
    token = token_of(ctx, job_id)
    headers = {"Authorization": f"Bearer {token}"}

    def drain(host: str, indices: list[int]) -> list[int]:
        return client.post(
            f"/api/attempts/{job_id}/1/drain", json={"host": host, "indices": indices}, headers=headers
        ).json()["drained"]

    assert drain("lab-a", [1]) == [], "another job's GPU"
    assert drain("lab-b", [0]) == [], "another host's"
    assert drain("lab-a", [0, 1]) == [0]
    with ctx.db.read() as session:
        drained = session.execute(select(Gpu.index, Gpu.drained).join(Host).where(Host.name == "lab-a")).all()
    assert sorted(drained) == [(0, True), (1, False)]


def test_a_door_is_a_sessions_own_on_its_node_and_a_rank_port(ctx: Context, client: TestClient) -> None:
    session_id, job_id = dispatched(ctx, "alice", 0, "notebook"), dispatched(ctx, "alice", 1)
    low, high = ctx.settings.rank_port_range

    def door(job: int, address: str, key: str = "ab" * 32) -> int:
        return call(client, token_of(ctx, job), "POST", f"/api/attempts/{job}/1/door", {"address": address, "key": key})

    def doors() -> list[tuple[int, str]]:
        with ctx.db.read() as session:
            return [(row[0], row[1]) for row in session.execute(select(RankAddress.job_id, RankAddress.address))]

    assert door(job_id, f"lab-a:{low}") == 422, "a model job has no door for the proxy to open"
    for address in (
        f"127.0.0.1:{low}",  # the API's own machine: its Redis, its database
        f"db.lab:{low}",  # another host
        "lab-a:6379",  # its node, but not a rank port: Redis
        f"lab-a:{high + 1}",
        f"lab-a:{low}/../x",
    ):
        assert door(session_id, address) == 422, address
    assert door(session_id, f"lab-a:{low}", key="not-hex") == 422
    assert doors() == [], "nothing refused was recorded"
    assert door(session_id, f"lab-a:{low}") == 204  # the session's node (the job's host), a rank port
    assert doors() == [(session_id, f"lab-a:{low}")]
    assert call(client, token_of(ctx, session_id), "DELETE", f"/api/attempts/{session_id}/1/door", None) == 204
    assert doors() == []
