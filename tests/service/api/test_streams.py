"""Open job pages hold no database session: with 100 event streams open on one API process
(more than its connection pool; four members' pages, a token holding at most
TOWERQ_MAX_STREAMS_PER_TOKEN), submissions and metric writes stay as fast as with none."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from service.core.db import Database
from service.core.models import Metric
from tests.stack import Stack

pytestmark = pytest.mark.slow
STREAMS = 100
SAMPLES = 20
SPEC = {"model": "mlp", "dataset": "digits", "gpu_count": 1, "hyperparameters": {"steps": 10}}


def submit_times(client: httpx.Client) -> list[float]:
    times = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        response = client.post("/api/jobs", json=SPEC)
        times.append(time.perf_counter() - started)
        assert response.status_code == 201, response.text
    return times


def metric_write_times(db: Database, job_id: int, first_step: int) -> list[float]:
    times = []
    for step in range(first_step, first_step + SAMPLES):
        started = time.perf_counter()
        with db.write() as session:
            session.add(Metric(job_id=job_id, attempt=1, step=step, split="train", loss=1.0, time=datetime.now(UTC)))
        times.append(time.perf_counter() - started)
    return times


def hold_streams(url: str, token: str, job_id: int, opened: threading.Semaphore, done: threading.Event) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(30, read=None)) as client:
        with client.stream("GET", f"/api/jobs/{job_id}/stream") as response:
            assert response.status_code == 200
            next(response.iter_text())  # ": connected"
            opened.release()
            done.wait(120)


def test_a_hundred_open_job_pages_do_not_slow_submissions_or_metric_writes(
    stack: Stack, make_token: Callable[..., str], add_host: Callable[..., None], db: Database
) -> None:
    if not db.is_sqlite:
        pytest.skip("the SQLite path is the one with a single writer; PostgreSQL is covered by the API tests")
    url = stack.start_api(api_workers=1)
    add_host("lab-a", 4)
    token = make_token("alice")
    readers = [make_token(name) for name in ("bob", "carol", "dan", "erin")]
    client = stack.client(token)
    job_id = client.post("/api/jobs", json=SPEC).json()["id"]
    before = submit_times(client), metric_write_times(db, job_id, 1)

    opened, done = threading.Semaphore(0), threading.Event()
    holders = [
        threading.Thread(target=hold_streams, args=(url, readers[i % 4], job_id, opened, done), daemon=True)
        for i in range(STREAMS)
    ]
    for holder in holders:
        holder.start()
    try:
        for _ in range(STREAMS):
            assert opened.acquire(timeout=60), "every stream opens"
        during = submit_times(client), metric_write_times(db, job_id, 1 + SAMPLES)
    finally:
        done.set()
        for holder in holders:
            holder.join(30)
        client.close()
    for what, quiet, busy in zip(("submit", "metric write"), before, during, strict=True):
        quiet_p50, busy_p50 = statistics.median(quiet), statistics.median(busy)
        assert busy_p50 <= 2 * quiet_p50 + 0.02, f"{what}: median {busy_p50:.3f}s with streams vs {quiet_p50:.3f}s"
        assert max(busy) < 1.0, f"{what}: slowest {max(busy):.3f}s with {STREAMS} streams open"
