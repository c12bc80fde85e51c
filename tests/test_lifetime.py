"""Every process towerq starts dies with its parent, even when the parent dies by SIGKILL:
uvicorn's API workers, the embedded Redis; and a restarted API gets its port back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from service.core.settings import Settings
from tests.conftest import free_port
from tests.stack import REPO, settings_env, wait_for
from worker.processes import live_members, pid_alive

pytestmark = pytest.mark.slow


def start_api(settings: Settings, port: int, workers: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "api", "--port", str(port)],
        cwd=REPO,
        env=settings_env(settings, api_workers=workers),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_api_workers_die_with_a_killed_api_and_a_restarted_api_gets_the_port(
    make_settings: Callable[..., Settings], sqlite_url: str
) -> None:
    settings = make_settings(sqlite_url)
    port = free_port()
    api = start_api(settings, port, workers=2)
    try:
        wait_for(lambda: healthy(port), 60, "the API to answer")
        workers = [p for p in live_members(sid=api.pid) if p.ppid == api.pid]
        assert len(workers) >= 2, workers
        os.kill(api.pid, signal.SIGKILL)
        api.wait()
        wait_for(lambda: not live_members(sid=api.pid), 15, "the API's worker processes to die with it")
        assert not healthy(port)

        again = start_api(settings, port, workers=2)
        try:
            wait_for(lambda: healthy(port), 60, "a restarted API to serve on the same port")
        finally:
            again.terminate()
            again.wait(30)
    finally:
        for leftover in live_members(sid=api.pid):
            os.kill(leftover.pid, signal.SIGKILL)
        if api.poll() is None:
            api.wait()


EMBEDDED = """
import sys, time
from pathlib import Path
from service.cli.redis_server import EmbeddedRedis
redis = EmbeddedRedis(sys.argv[1], Path(sys.argv[2]))
redis.start()
print(redis.process.pid, flush=True)
time.sleep(600)
"""


def test_the_embedded_redis_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    owner = subprocess.Popen(
        [sys.executable, "-c", EMBEDDED, url, str(tmp_path / "redis")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert owner.stdout is not None
    redis_pid = int(owner.stdout.readline())
    try:
        assert pid_alive(redis_pid)
        owner.kill()
        owner.wait()
        wait_for(lambda: not pid_alive(redis_pid), 10, "the embedded Redis to die with its owner")
    finally:
        if pid_alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
