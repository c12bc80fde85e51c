"""`towerq up`: the whole service for one machine, in one foreground process tree.

Migrates the database, uses the Redis at `TOWERQ_REDIS_URL` or starts an embedded one,
creates an admin token on a fresh database (printed once, with a login URL, and saved in
`var/admin-token`), then runs the API, the scheduler and a worker as child processes and
restarts any that crashes. Ctrl+C (or SIGTERM) stops them all cleanly: the worker
checkpoints its trainers and puts their jobs back in the queue, then Redis stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import select

from service.cli.redis_server import EmbeddedRedis, answers, embedded_url
from service.core.db import Database, upgrade_database
from service.core.keyspace import KeyspaceError, claim, identity
from service.core.lifetime import dies_with_this_process
from service.core.models import Host
from service.core.settings import Settings, redacted
from service.core.tokenfile import write_secret
from service.lab.auth import bootstrap_admin

log = logging.getLogger("towerq.up")

STOP_GRACE_S = 60.0
RESTART_DELAY_S = 2.0


@dataclass
class Child:
    name: str
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)


class Supervisor:
    def __init__(self, settings: Settings, host: str, port: int, worker: bool = True) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.stopping = False
        self.signals = 0
        """SIGINT and SIGTERM so far: the first stops cleanly, a second at once (`_stop_all`)."""
        self.redis: EmbeddedRedis | None = None
        base = [sys.executable, "-m", "service.cli"]
        self.children = [
            Child("api", [*base, "api", "--host", host, "--port", str(port)]),
            Child("scheduler", [*base, "scheduler"]),
        ]
        if worker:
            self.children.append(Child("worker", [*base, "worker"]))

    def run(self) -> int:
        for folder in (
            self.settings.var_dir,
            self.settings.data_dir,
            self.settings.artifacts_dir,
            self.settings.models_path,
        ):
            folder.mkdir(parents=True, exist_ok=True)
        upgrade_database(self.settings.database_url)
        token = self._bootstrap_admin()
        self._ensure_redis()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            for child in self.children:
                self._start(child)
            self._banner(token)
            while not self.stopping:
                self._watch()
                time.sleep(0.5)
        finally:
            self._stop_all()
        return 0

    @property
    def token_file(self) -> Path:
        """Where the first start saves the admin token it makes."""
        return self.settings.var_dir / "admin-token"

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1
        self.stopping = True

    def _ensure_redis(self) -> None:
        """Use the Redis the settings name if it answers and is not another towerq service's;
        else start one of its own: on that URL's port when nothing answered there, on a free
        port when the default one belongs to another service (two labs on one machine). A
        Redis named in TOWERQ_REDIS_URL that another service holds is refused, not replaced."""
        asked = self.settings.redis_url
        why = f"none answered at {redacted(asked)}"
        if answers(asked):
            db = Database(self.settings.database_url)
            try:
                claim(asked, identity(db))
                self.redis_note = f"Redis at {redacted(asked)}"
                return
            except KeyspaceError:
                if "TOWERQ_REDIS_URL" in os.environ:
                    raise
                why = f"the one at {redacted(asked)} holds another towerq service's keys"
                asked = f"redis://127.0.0.1:{free_port()}/0"
            finally:
                db.dispose()
        url = embedded_url(asked)
        self.redis = EmbeddedRedis(url, self.settings.var_dir / "redis")
        self.redis.start()
        self.settings = self.settings.model_copy(update={"redis_url": url})  # what the children get
        self.redis_note = f"embedded Redis on port {self.redis.port}, with a password ({why})"

    def _bootstrap_admin(self) -> str | None:
        db = Database(self.settings.database_url)
        try:
            with db.write() as session:
                secret = bootstrap_admin(session, label="created by towerq up")
        finally:
            db.dispose()
        if secret is None:
            return None
        write_secret(self.token_file, secret)
        return secret

    def _start(self, child: Child) -> None:
        env = {**os.environ, "TOWERQ_REDIS_URL": self.settings.redis_url}
        # SIGTERM, not SIGKILL: a worker whose `towerq up` was killed still checkpoints
        # its trainers and puts their jobs back in the queue.
        child.process = subprocess.Popen(child.command, env=env, preexec_fn=dies_with_this_process(signal.SIGTERM))
        log.info("started %s (pid %d)", child.name, child.process.pid)

    def _watch(self) -> None:
        for child in self.children:
            assert child.process is not None
            code = child.process.poll()
            if code is None or self.stopping:
                continue
            now = time.monotonic()
            child.restarts = [t for t in child.restarts if now - t < 60] + [now]
            if len(child.restarts) > 5:
                log.error("%s keeps exiting (code %s); stopping towerq", child.name, code)
                self.stopping = True
                return
            log.warning("%s exited with code %s; restarting it", child.name, code)
            time.sleep(RESTART_DELAY_S)
            self._start(child)

    def _stop_all(self) -> None:
        running = [(c.name, c.process) for c in self.children if c.process is not None and c.process.poll() is None]
        for _, process in running:
            process.send_signal(signal.SIGTERM)
        if running and self.signals < 2:
            log.info(
                "stopping: the worker checkpoints its running jobs and puts them back in the queue; "
                "Ctrl+C again stops at once (they resume from their last checkpoint, as after a crash)"
            )
        deadline = time.monotonic() + STOP_GRACE_S
        killed = []
        for name, process in running:
            while process.poll() is None:
                if self.signals >= 2:
                    log.warning("%s (pid %d) stopped at once, as asked", name, process.pid)
                elif time.monotonic() >= deadline:
                    log.error("%s (pid %d) did not stop within %.0f s; killed it", name, process.pid, STOP_GRACE_S)
                else:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(0.2)
                    continue
                process.kill()
                process.wait()
                killed.append(name)
        if "worker" in killed:
            try:
                self._tidy_after_worker()
            except Exception:  # Redis still stops; the worker's next start does it instead
                log.exception("could not tidy after the killed worker")
        if self.redis is not None:
            self.redis.stop()
        log.info("towerq stopped")

    def _tidy_after_worker(self) -> None:
        """A worker killed before it stopped leaves its trainers' cgroups and the job folders
        mounted on their disk images (`worker.disk`): what its next start would do first is
        done now (`HostAgent._recover_leftovers`), so a lab that does not start towerq again
        keeps no mount or loop device. Its jobs go back to the queue at the next start, as
        after a crash, and resume from their last checkpoint on the host's disk."""
        from worker import cgroups, disk

        cgroups.remove_stale()  # what is left of its trainers, so nothing writes the folders any more
        disks = disk.disks_of(self.settings)
        before = len(disk.images_in(disks))
        disk.sweep(disks)
        if (back := before - len(disk.images_in(disks))) > 0:
            log.info("%d job folders back on the host's disk from their disk images", back)

    def _banner(self, token: str | None) -> None:
        url = f"http://{'127.0.0.1' if self.host in ('0.0.0.0', '::') else self.host}:{self.port}"
        healthy = self._wait_healthy(url)
        gpus = self._gpu_note()
        lines = ["", f"towerq is up: dashboard and API on {url}" + ("" if healthy else " (not answering yet)")]
        if token:
            lines += [
                f"  log in:  {url}/#token={token}",
                f"  admin token (shown once; also saved in {self.token_file}):",
                f"  {token}",
            ]
        else:
            lines += self._saved_login(url, healthy)
        lines += [
            f"  GPUs: {gpus}",
            f"  database: {redacted(self.settings.database_url)}",
            f"  redis: {self.redis_note}",
            "  Ctrl+C stops everything.",
            "",
        ]
        print("\n".join(lines), flush=True)

    def _saved_login(self, url: str, healthy: bool) -> list[str]:
        """A later start's login link: the admin token the first start saved, unless the API
        refuses it (revoked) or the file is gone."""
        path = self.token_file
        try:
            token = path.read_text().strip()
        except OSError:
            token = ""
        if not token:
            return [f"  log in with your token; the admin token saved in {path} is not there"]
        if healthy:
            try:
                refused = httpx.get(f"{url}/api/me", headers={"Authorization": f"Bearer {token}"}, timeout=5)
            except httpx.HTTPError:
                refused = None
            if refused is not None and refused.status_code == 401:
                return [
                    f"  log in with your token; the admin token saved in {path} no longer works: "
                    "make one with `towerq token create --user NAME --admin`"
                ]
        return [f"  log in:  {url}/#token={token}", f"  (the admin token saved in {path})"]

    def _wait_healthy(self, url: str, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stopping:
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        return False

    def _gpu_note(self, timeout: float = 20.0) -> str:
        if not any(c.name == "worker" for c in self.children):
            return "no worker started on this host (--no-worker)"
        db = Database(self.settings.database_url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and not self.stopping:
                with db.read() as session:
                    host = session.scalars(select(Host).where(Host.name == self.settings.host_name)).one_or_none()
                    if host is not None and host.last_heartbeat_at.timestamp() > time.time() - 60:
                        count = sum(1 for g in host.gpus if g.present)
                        kind = (
                            "simulated GPUs (CPU logical devices; no NVIDIA driver)"
                            if host.simulated
                            else "NVIDIA GPUs"
                        )
                        return f"{count} {kind} on {host.name}"
                time.sleep(0.3)
        finally:
            db.dispose()
        return "the worker has not registered yet"


def free_port() -> int:
    """A TCP port nothing listens on now, on the loopback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
