"""Two towerq services, one Redis: the second is told, not mixed in. Each service's database
has its identity; every process claims the Redis server for it as it opens its resources;
a database number is no way around it (pub/sub channels are the server's); `towerq up`
with the default Redis taken starts one of its own instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from service.cli.up import Supervisor
from service.core.context import Context
from service.core.db import Database
from service.core.keyspace import KeyspaceError, identity, owner
from service.core.settings import Settings
from tests.stack import REPO, wait_for


@pytest.fixture
def lab_b(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "other-lab.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def test_a_second_service_on_one_redis_server_is_refused_whatever_its_database_number(
    make_settings: Callable[..., Settings], sqlite_url: str, lab_b: str, redis_url: str
) -> None:
    ours = make_settings(sqlite_url)
    Context.open(ours).close()
    mine = identity(Database(sqlite_url))
    assert owner(redis_url) == mine and identity(Database(sqlite_url)) == mine  # made once, kept

    other_number = redis_url.rsplit("/", 1)[0] + "/2"
    for url in (redis_url, other_number):
        with pytest.raises(KeyspaceError) as refused:
            Context.open(make_settings(lab_b, redis_url=url))
        said = str(refused.value)
        assert f"lab {mine[:8]}" in said and "Redis server of its own (TOWERQ_REDIS_URL)" in said, said
    Context.open(ours).close()  # the first keeps its Redis

    redis.Redis.from_url(redis_url).flushall()  # a flush loses the claim: the next process makes it
    Context.open(make_settings(lab_b)).close()
    with pytest.raises(KeyspaceError):
        Context.open(ours)


def test_a_refused_process_says_so_and_exits_1(
    make_settings: Callable[..., Settings], sqlite_url: str, lab_b: str, redis_url: str
) -> None:
    Context.open(make_settings(sqlite_url)).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_")}
    env |= {"TOWERQ_DATABASE_URL": lab_b, "TOWERQ_REDIS_URL": redis_url, "PYTHONPATH": str(REPO)}
    for command in ("scheduler", "api"):
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", command], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert "holds the keys of another towerq service" in done.stderr and "Traceback" not in done.stderr


def test_towerq_up_starts_a_redis_of_its_own_when_the_default_one_is_another_services(
    make_settings: Callable[..., Settings], sqlite_url: str, lab_b: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    Context.open(make_settings(sqlite_url)).close()
    monkeypatch.delenv("TOWERQ_REDIS_URL", raising=False)
    second = Supervisor(make_settings(lab_b), "127.0.0.1", 0)
    second._ensure_redis()
    try:
        assert second.redis is not None and second.settings.redis_url != redis_url
        assert "holds another towerq service's keys" in second.redis_note
        Context.open(second.settings).close()  # its own Redis, claimed for it
    finally:
        assert second.redis is not None
        second.redis.stop()

    monkeypatch.setenv("TOWERQ_REDIS_URL", redis_url)  # named by the admin: refused, not replaced
    with pytest.raises(KeyspaceError):
        Supervisor(make_settings(lab_b), "127.0.0.1", 0)._ensure_redis()


def test_a_running_scheduler_claims_its_redis_again_after_a_flush_and_stops_if_another_took_it(
    make_settings: Callable[..., Settings], sqlite_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from service.cli.scheduling import serve
    from service.core import defaults, keys

    monkeypatch.setattr(defaults, "KEYSPACE_CLAIM_S", 0.2)
    ctx = Context.open(make_settings(sqlite_url))
    mine = identity(ctx.db)
    stop, failed = threading.Event(), []

    def run() -> None:
        try:
            serve(ctx, stop)
        except KeyspaceError as err:
            failed.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    server = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/0")  # the claim is the server's, in database 0
    try:
        server.flushall()  # the claim is lost: the scheduler makes it again
        wait_for(lambda: owner(redis_url) == mine, 10, "the scheduler to claim its Redis again")
        server.flushall()
        server.set(keys.LAB_OWNER, "f" * 32)  # another service's process started first
        thread.join(10)
        assert not thread.is_alive() and failed, "the scheduler went on with another service's Redis"
        assert "holds the keys of another towerq service (lab ffffffff" in str(failed[0])
    finally:
        stop.set()
        thread.join(10)
        ctx.close()
