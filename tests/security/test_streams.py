"""Live streams cannot exhaust Redis: each SSE stream held a Redis connection of its own
with no cap, so about 10,000 open streams (one member's script) took every Redis client of
the lab. Now an API process holds one subscription whatever the number of streams, and a
token may hold TOWERQ_MAX_STREAMS_PER_TOKEN of them. An open stream asks again every few
seconds whether its reader may read it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import httpx
import redis
from sqlalchemy import select

from service.api.routes.stream import RECHECK_S
from service.core.db import Database
from service.core.models import ApiToken, User
from service.lab.auth import revoke_token
from tests.stack import Stack, wait_for

SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 10}}
CAP = 8


class Stream:
    """An open SSE response and its one line iterator (dropping the iterator would close it)."""

    def __init__(self, stack: ExitStack, url: str, token: str, path: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        client = stack.enter_context(httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(30, read=None)))
        self.response = stack.enter_context(client.stream("GET", path))
        self.status_code = self.response.status_code
        if self.status_code == 200:
            self.lines = self.response.iter_lines()
            assert next(self.lines).startswith(": connected")

    def events(self) -> Iterator[str]:
        for line in self.lines:
            if line.startswith("data: "):
                yield line[len("data: ") :]


def open_stream(stack: ExitStack, url: str, token: str, path: str) -> Stream:
    return Stream(stack, url, token, path)


def clients_of(redis_client: redis.Redis) -> int:
    return len(redis_client.client_list())


def test_streams_share_one_redis_subscription_and_a_token_holds_at_most_its_cap(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], redis_client: redis.Redis
) -> None:
    url = stack.start_api(api_workers=1, max_streams_per_token=CAP)
    add_host("lab-a", 4)
    alice, bob = make_token("alice"), make_token("bob")
    job_id = stack.client(alice).post("/api/jobs", json=SPEC).json()["id"]
    with ExitStack() as held:
        first = open_stream(held, url, alice, f"/api/jobs/{job_id}/stream")
        baseline = clients_of(redis_client)
        kept = [open_stream(held, url, alice, f"/api/jobs/{job_id}/stream") for _ in range(CAP - 1)]
        assert [stream.status_code for stream in kept] == [200] * (CAP - 1)
        refused = open_stream(held, url, alice, "/api/stream")
        assert refused.status_code == 429
        refused.response.read()
        assert "TOWERQ_MAX_STREAMS_PER_TOKEN" in refused.response.json()["detail"]
        kept += [open_stream(held, url, bob, f"/api/jobs/{job_id}/stream") for _ in range(CAP)]
        assert [stream.status_code for stream in kept[CAP - 1 :]] == [200] * CAP, "bob is not held back by alice"
        assert clients_of(redis_client) <= baseline + 1, "2 x CAP streams, at most one more Redis connection"

        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(next(first.events())), daemon=True)
        reader.start()
        redis_client.publish(f"towerq:job:{job_id}", '{"type": "metric", "step": 7}')
        reader.join(10)
        assert got == ['{"type": "metric", "step": 7}'], "a message still reaches every stream"
    # closed streams give their slots back (the server notices each client gone a moment later)
    with ExitStack() as held:
        wait_for(lambda: open_stream(held, url, alice, "/api/stream").status_code == 200, 10, "a slot given back")


def test_another_members_stream_carries_no_log_lines_of_a_private_job(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], redis_client: redis.Redis
) -> None:
    url = stack.start_api(api_workers=1)
    add_host("lab-a", 4)
    alice, bob = make_token("alice"), make_token("bob")
    job_id = stack.client(alice).post("/api/jobs", json=SPEC).json()["id"]
    seen: dict[str, list[str]] = {"alice": [], "bob": []}
    with ExitStack() as held:
        readers, kept = [], []
        for who, token in (("alice", alice), ("bob", bob)):
            stream = open_stream(held, url, token, f"/api/jobs/{job_id}/stream")
            kept.append(stream)

            def read(stream: Stream = stream, into: list[str] = seen[who]) -> None:
                for data in stream.events():
                    into.append(data)
                    if '"metric"' in data:
                        return

            readers.append(threading.Thread(target=read, daemon=True))
        for reader in readers:
            reader.start()
        channel = f"towerq:job:{job_id}"
        redis_client.publish(channel, '{"type": "log", "message": "trained on users/alice/cells"}')
        redis_client.publish(channel, '{"type": "metric", "step": 1}')
        for reader in readers:
            reader.join(10)
    assert [len(seen["alice"]), len(seen["bob"])] == [2, 1]
    assert all('"log"' not in data for data in seen["bob"])


def test_an_open_stream_stops_serving_a_reader_whose_right_went(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], redis_client: redis.Redis, db: Database
) -> None:
    """The stream used to decide once, at its start: after alice made her job private and
    the admin revoked bob's token, bob's open stream went on with her log lines to the end."""
    url = stack.start_api(api_workers=1)
    add_host("lab-a", 4)
    alice, bob = make_token("alice"), make_token("bob")
    owner = stack.client(alice)
    job_id = owner.post("/api/jobs", json={**SPEC, "visibility": "lab"}).json()["id"]
    channel = f"towerq:job:{job_id}"
    with ExitStack() as held:
        stream = open_stream(held, url, bob, f"/api/jobs/{job_id}/stream")
        seen: list[str] = []
        ended = threading.Event()

        def read() -> None:
            for data in stream.events():
                seen.append(data)
            ended.set()

        threading.Thread(target=read, daemon=True).start()
        redis_client.publish(channel, '{"type": "log", "message": "shared while it was shared"}')
        wait_for(lambda: seen, 10, "bob to read a shared line")
        assert owner.patch(f"/api/jobs/{job_id}", json={"visibility": "private"}).status_code == 200
        time.sleep(RECHECK_S + 1)  # the stream's next look at who may read it
        redis_client.publish(channel, '{"type": "log", "message": "private now: patient=Jane Doe"}')
        redis_client.publish(channel, '{"type": "metric", "step": 3}')
        wait_for(lambda: len(seen) >= 2, 10, "the metric point")
        assert all("Jane Doe" not in data for data in seen), seen

        with db.write() as session:
            token_id = session.scalars(select(ApiToken.id).join(User).where(User.name == "bob")).one()
            revoke_token(session, token_id)
        assert ended.wait(RECHECK_S + 5), "a revoked token's stream goes on"
    owner.close()


def test_a_member_holds_a_capped_number_of_streams_over_all_their_tokens(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None]
) -> None:
    """Three tokens minted by one member were three times the per-token cap: no cap."""
    url = stack.start_api(api_workers=1, max_streams_per_token=CAP, max_streams_per_member=CAP + 2)
    add_host("lab-a", 4)
    first, second = make_token("alice"), make_token("alice")
    with ExitStack() as held:
        kept = [open_stream(held, url, first, "/api/stream") for _ in range(CAP)]
        kept += [open_stream(held, url, second, "/api/stream") for _ in range(2)]
        assert [stream.status_code for stream in kept] == [200] * (CAP + 2)
        refused = open_stream(held, url, second, "/api/stream")
        assert refused.status_code == 429
        refused.response.read()
        assert "TOWERQ_MAX_STREAMS_PER_MEMBER" in refused.response.json()["detail"]
        assert open_stream(held, url, make_token("bob"), "/api/stream").status_code == 200


def test_a_stream_ends_after_its_life_though_its_keepalives_would_hold_a_reader_forever(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None]
) -> None:
    """A client that reads a stream to its end (no read timeout can fire: keepalives come
    every 15 s) is let go after TOWERQ_STREAM_MAX_LIFE_S, its token asked again when it
    reconnects; the fuzz test's streams of existing jobs hung for an hour before."""
    url = stack.start_api(api_workers=1, stream_max_life_s=2)
    add_host("lab-a", 4)
    alice = make_token("alice")
    job_id = stack.client(alice).post("/api/jobs", json=SPEC).json()["id"]
    for path in (f"/api/jobs/{job_id}/stream", "/api/stream"):
        started = time.monotonic()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {alice}"}, timeout=30) as client:
            response = client.get(path)  # the whole body: returns once the server ends it
        assert response.status_code == 200 and response.text.startswith(": connected"), path
        assert 2 <= time.monotonic() - started < 10, f"{path}: ended after {time.monotonic() - started:.1f} s"
