"""Load test: 1,000 job submissions from 50 concurrent clients against a whole, live stack.

Starts a real stack in a temporary folder (API, scheduler, workers with simulated GPUs;
its own Redis), SQLite by default or PostgreSQL with `--postgres URL`. During the burst a
worker is up on `live-host`, heartbeating, and one of its jobs streams a metric row every
step into the database and pub/sub, as a lab's would. 50 clients (each with its own token)
submit 1,000 tiny jobs between them for `load-host`, each with an Idempotency-Key, and every
10th request is sent twice (a client retrying). Meanwhile a sampler checks, from the
database, that no GPU is ever given more than it has.

Printed: submissions/s, p50/p99 latency, and the invariants, checked from the database:
every submission stored exactly once (retries included), no attempt run twice (one
`running` event per attempt at most), no over-committed GPU at any sampled instant. With
`--wait` it also waits until every job has run (slow: each tiny job is a TensorFlow
process). Bars: >= 500 submissions/s and p99 <= 250 ms with SQLite.

Usage: `python bench/load.py [--jobs 1000] [--clients 50] [--postgres URL] [--wait]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
from sqlalchemy import func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import settings_in  # noqa: E402
from service.cli.redis_server import EmbeddedRedis  # noqa: E402
from service.core.db import (
    Database,  # noqa: E402
    upgrade_database,  # noqa: E402
)
from service.core.models import Allocation, Job, JobEvent, Metric  # noqa: E402
from service.lab.auth import create_token  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.stack import Stack, wait_for  # noqa: E402
from worker.host import register  # noqa: E402
from worker.inventory import SimulatedInventory  # noqa: E402
from worker.processes import all_processes  # noqa: E402

TIMELINE: list[tuple[float, float]] = []
TINY = {
    "model": "mlp",
    "dataset": "digits",
    "host": "load-host",
    "gpu_memory_fraction": 0.25,
    "hyperparameters": {"steps": 20, "batch_size": 8, "log_every": 10, "eval_every": 0, "checkpoint_every": 0},
}
STREAMING = {
    "model": "mlp",
    "dataset": "digits",
    "host": "live-host",
    "gpus": [0],
    "hyperparameters": {"steps": 10**7, "batch_size": 8, "log_every": 1, "eval_every": 0, "checkpoint_every": 0},
}


class Connection:
    """A bare HTTP/1.1 keep-alive connection: the load generator must not eat the cores the
    API is measured on (httpx spends more CPU per request than the API does)."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.head = f"POST /api/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes, key: str) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        request = (
            f"{self.head}Content-Type: application/json\r\nIdempotency-Key: {key}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def client_loop(connection: Connection, count: int, latencies: list[float], errors: list[str]) -> None:
    body = json.dumps(TINY).encode()
    for i in range(count):
        key = str(uuid.uuid4())
        for _ in range(2 if i % 10 == 0 else 1):
            started = time.perf_counter()
            try:
                status = await connection.post(body, key)
            except (OSError, asyncio.IncompleteReadError) as err:
                errors.append(f"{type(err).__name__}: {err}")
                connection.writer = None
                continue
            latencies.append(time.perf_counter() - started)
            TIMELINE.append((started, latencies[-1]))
            if status not in (200, 201):
                errors.append(f"status {status}")


async def submit_all(url: str, tokens: list[str], jobs: int) -> tuple[float, list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    host, port = url.removeprefix("http://").split(":")
    connections = [Connection(host, int(port), t) for t in tokens]
    per_client = [jobs // len(tokens) + (1 if i < jobs % len(tokens) else 0) for i in range(len(tokens))]
    started = time.perf_counter()
    await asyncio.gather(*(client_loop(c, n, latencies, errors) for c, n in zip(connections, per_client, strict=True)))
    elapsed = time.perf_counter() - started
    for connection in connections:
        await connection.close()
    return elapsed, latencies, errors


def sample_over_commit(db: Database, stop: threading.Event, found: list[dict[int, float]], count: list[int]) -> None:
    while not stop.is_set():
        with db.read() as session:
            rows = session.execute(
                select(Allocation.gpu_id, func.sum(Allocation.fraction))
                .where(Allocation.released_at.is_(None))
                .group_by(Allocation.gpu_id)
            ).all()
        over = {gpu: total for gpu, total in rows if total > 1 + 1e-9}
        if over:
            found.append(over)
        count[0] += 1
        stop.wait(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument(
        "--postgres",
        default=None,
        metavar="ADMIN_URL",
        help="run on PostgreSQL: a database is created (and dropped) on this server, e.g. "
        "postgresql://towerq:towerq@127.0.0.1:5432/postgres (else SQLite)",
    )
    parser.add_argument("--wait", action="store_true", help="wait until every job has run")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="towerq-load-"))
    redis = EmbeddedRedis(f"redis://127.0.0.1:{free_port()}/0", workdir / "redis")
    redis.start()
    url = create_postgres_database(args.postgres) if args.postgres else f"sqlite:///{workdir / 'towerq.db'}"
    settings = settings_in(
        workdir,
        url,
        redis.url,
        simulated_gpus=4,
        scheduler_interval_s=1.0,
        host_name="load-host",
    )
    upgrade_database(settings.database_url)
    db = Database(url)
    with db.write() as session:
        tokens = [create_token(session, f"user{i:02d}")[1] for i in range(args.clients)]
    stack = Stack(settings, workdir)
    try:
        api = stack.start_api()
        stack.start_scheduler()
        register_host(db, "load-host")
        stack.start_worker("live-host", 1)
        streaming = start_streaming_job(stack, tokens[0])
        stop, over, samples = threading.Event(), [], [0]
        sampler = threading.Thread(target=sample_over_commit, args=(db, stop, over, samples), daemon=True)
        sampler.start()
        wait_until_idle()
        before, rows_before = cpu_seconds(), metric_rows(db, streaming)
        elapsed, latencies, errors = asyncio.run(submit_all(api, tokens, args.jobs))
        spent = {name: cpu_seconds().get(name, 0.0) - before.get(name, 0.0) for name in before}
        relayed = metric_rows(db, streaming) - rows_before
        stack.client(tokens[0]).post(f"/api/jobs/{streaming}/cancel")
        # The burst's jobs run after it: each is a TensorFlow process, and on this 2-core
        # machine they would take the cores the API is measured on.
        stack.start_worker("load-host", 4)
        if args.wait:
            wait_for(lambda: _unfinished(db) == 0, 24 * 3600, "every job to run", 2.0)
        else:
            time.sleep(30)  # let the scheduler and worker run some of them while sampling
        stop.set()
        sampler.join()
        report(db, args, elapsed, latencies, errors, over, samples[0])
        rate = relayed / elapsed
        print(f"meanwhile on live-host: heartbeats, and job {streaming} relayed {relayed} metric rows ({rate:.0f}/s)")
        if os.environ.get("TIMELINE"):
            t0 = min(t for t, _ in TIMELINE)
            slow = sorted(((t - t0, lat) for t, lat in TIMELINE if lat > 0.15))
            print("slow requests (start s, latency ms):", [(round(t, 2), round(lat * 1000)) for t, lat in slow][:60])
        print(
            "CPU during the burst: "
            + ", ".join(f"{name} {100 * s / elapsed:.0f}%" for name, s in sorted(spent.items()))
        )
    finally:
        stack.stop_all()
        redis.stop()
        db.dispose()
        if args.postgres:
            drop_postgres_database(args.postgres, url)


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process and every towerq process (by role)."""
    totals: dict[str, float] = {}
    for process in all_processes():
        cmd = process.cmdline
        if process.pid == os.getpid():
            role = "load generator"
        elif "service.cli api" in cmd or "multiprocessing" in cmd:
            role = "api"
        elif "service.cli scheduler" in cmd:
            role = "scheduler"
        elif "service.cli worker" in cmd or "worker.trainer" in cmd:
            role = "worker"
        elif "redis-server" in cmd:
            role = "redis"
        else:
            continue
        totals[role] = totals.get(role, 0.0) + process.cpu_s
    return totals


def create_postgres_database(admin_url: str) -> str:
    name = f"towerq_load_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + name


def drop_postgres_database(admin_url: str, url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def wait_until_idle(timeout: float = 60.0) -> None:
    """Until every process of the stack has finished starting (its CPU use falls quiet), so
    that start-up work is not counted in the burst."""
    deadline = time.monotonic() + timeout
    previous = cpu_seconds()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        current = cpu_seconds()
        busy = sum(current.get(role, 0.0) - previous.get(role, 0.0) for role in ("api", "scheduler"))
        if busy < 0.05:
            return
        previous = current


def start_streaming_job(stack: Stack, token: str) -> int:
    """A job on the live worker that writes a metric row every step, running before the burst."""
    client = stack.client(token)
    wait_for(lambda: any(w["name"] == "live-host" for w in client.get("/api/workers").json()), 60, "live-host")
    job_id: int = client.post("/api/jobs", json=STREAMING).json()["id"]
    wait_for(lambda: (client.get(f"/api/jobs/{job_id}").json()["step"] or 0) >= 50, 120, "the job to stream")
    client.close()
    return job_id


def metric_rows(db: Database, job_id: int) -> int:
    with db.read() as session:
        return session.scalar(select(func.count()).select_from(Metric).where(Metric.job_id == job_id)) or 0


def register_host(db: Database, name: str) -> None:
    """The worker's host and GPUs, as the worker registers them, so that jobs are checked
    against real GPUs and placed while the API is loaded."""
    with db.write() as session:
        register(session, name, SimulatedInventory(name, 4), {"registered_by": "bench/load.py"})


def _unfinished(db: Database) -> int:
    with db.read() as session:
        return session.scalar(select(func.count()).where(Job.state.not_in(["succeeded", "failed", "cancelled"]))) or 0


def report(
    db: Database,
    args: argparse.Namespace,
    elapsed: float,
    latencies: list[float],
    errors: list[str],
    over: list[dict[int, float]],
    samples: int,
) -> None:
    with db.read() as session:
        stored = session.scalar(select(func.count(Job.id)).where(Job.idempotency_key.is_not(None))) or 0
        keys = session.scalar(select(func.count(func.distinct(Job.idempotency_key)))) or 0
        twice = session.execute(
            select(JobEvent.job_id, JobEvent.attempt)
            .where(JobEvent.state == "running")
            .group_by(JobEvent.job_id, JobEvent.attempt)
            .having(func.count() > 1)
        ).all()
        ran = session.scalar(select(func.count(func.distinct(JobEvent.job_id))).where(JobEvent.state == "running")) or 0
        states = dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())
        backend = session.execute(text("SELECT 1")).scalar() and db.engine.dialect.name
    submissions = args.jobs
    rate = submissions / elapsed
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000
    print(f"{submissions} submissions ({len(latencies)} requests with retries) from {args.clients} clients, {backend}")
    print(f"submissions/s: {rate:.0f}   (bar >= 500: {'met' if rate >= 500 else 'NOT met'})")
    print(f"latency p50 {p50:.0f} ms, p99 {p99:.0f} ms   (bar p99 <= 250 ms: {'met' if p99 <= 250 else 'NOT met'})")
    print(f"errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
    once = "yes" if stored == keys == submissions else "NO"
    print(f"stored: {stored} jobs for {keys} distinct keys (each stored once: {once})")
    print(f"jobs that ran: {ran}; attempts run twice: {len(twice)}; states now: {states}")
    print(f"GPU over-commit at {samples} sampled instants: {'none' if not over else over[:3]}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
