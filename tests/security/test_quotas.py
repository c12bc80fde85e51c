"""Quotas that hold under parallel uploads: the dataset quota was checked once at the start
of each upload, so uploads running side by side each got the whole room; code bundles had
no quota at all."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from service.core.exceptions import TooLargeError
from service.core.settings import Settings
from service.uploads import code, datasets
from service.uploads.unpack import Limits
from tests.service.api.conftest import Api


class Arriving(io.BytesIO):
    """An upload whose body arrives once every upload has started (a barrier on the first
    read), as parallel requests' bodies do; an upload held back by a lock goes on after the
    barrier's timeout."""

    def __init__(self, data: bytes, barrier: threading.Barrier) -> None:
        super().__init__(data)
        self.barrier = barrier
        self.waited = False

    def read(self, size: int | None = -1) -> bytes:
        if not self.waited:
            self.waited = True
            try:
                self.barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass
        return super().read(size)


def npz_of(size: int) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros(size // 8, dtype=np.float64), y=np.zeros(1))
    return buffer.getvalue()


def side_by_side(*uploads: Callable[[], object]) -> list[object]:
    results: list[object] = [None] * len(uploads)

    def run(i: int) -> None:
        try:
            results[i] = uploads[i]()
        except Exception as err:  # the refusal is the result
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(uploads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_two_dataset_uploads_side_by_side_cannot_both_take_the_room(tmp_path: Path) -> None:
    data = npz_of(60_000)
    quota = int(len(data) * 1.5)  # room for one, not two
    barrier = threading.Barrier(2)

    def upload(name: str) -> Callable[[], object]:
        return lambda: datasets.store(Arriving(data, barrier), "a.npz", name, tmp_path, "alice", quota, 10)

    results = side_by_side(upload("one"), upload("two"))
    refused = [r for r in results if isinstance(r, TooLargeError)]
    assert len(refused) == 1, results
    assert "TOWERQ_USER_DATA_QUOTA_BYTES" in str(refused[0])
    assert datasets.usage(tmp_path, "alice") <= quota


def test_two_code_uploads_side_by_side_cannot_both_take_the_room(tmp_path: Path) -> None:
    barrier = threading.Barrier(2)
    limits = Limits(1_000_000, 10, 1_000_000)
    first, second = b"x = 1\n" * 10_000, b"y = 2\n" * 10_000

    def upload(source: bytes) -> Callable[[], object]:
        return lambda: code.store(Arriving(source, barrier), "net.py", tmp_path, limits, "alice", 90_000)

    results = side_by_side(upload(first), upload(second))
    refused = [r for r in results if isinstance(r, TooLargeError)]
    assert len(refused) == 1, results
    assert "TOWERQ_USER_CODE_QUOTA_BYTES" in str(refused[0])
    assert code.usage(tmp_path, "alice") == 60_000


@pytest.fixture
def settings(make_settings: Callable[..., Settings], database_url: str) -> Settings:
    return make_settings(database_url, user_code_quota_bytes=100_000, user_max_queued_jobs=3)


def test_the_code_quota_is_per_member_and_named_over_the_api(as_user: Callable[..., Api]) -> None:
    alice, bob = as_user("alice"), as_user("bob")
    big = b"# padding\n" * 7_000
    assert alice.post("/api/code", files={"file": ("a.py", big)}).status_code == 201
    over = alice.post("/api/code", files={"file": ("b.py", big + b"# more\n")})
    assert over.status_code == 413, over.text
    assert over.json()["detail"][0]["msg"].startswith("file: over your code quota (TOWERQ_USER_CODE_QUOTA_BYTES)")
    assert alice.post("/api/code", files={"file": ("a.py", big)}).status_code == 200  # hers already: no more room
    assert bob.post("/api/code", files={"file": ("b.py", big + b"# more\n")}).status_code == 201


def test_a_member_cannot_flood_the_queue(as_user: Callable[..., Api], add_host: Callable[..., None]) -> None:
    add_host("lab-a", 2)
    mallory, alice = as_user("mallory"), as_user("alice")
    spec = {"model": "mlp", "dataset": "digits", "gpus": [0]}
    assert [mallory.post("/api/jobs", json=spec).status_code for _ in range(3)] == [201] * 3
    flood = mallory.post("/api/jobs", json=spec)
    assert flood.status_code == 429 and "TOWERQ_USER_MAX_QUEUED_JOBS" in flood.json()["detail"], flood.text
    sweep = {"name": "s", "base": spec, "grid": {"hyperparameters.learning_rate": [0.1, 0.01]}}
    assert mallory.post("/api/sweeps", json=sweep).status_code == 429
    assert alice.post("/api/sweeps", json=sweep).status_code == 201  # another member is not held back
    assert alice.post("/api/jobs", json=spec).status_code == 201  # her sweep's 2 and this one: 3
    assert alice.post("/api/jobs", json=spec).status_code == 429


def test_the_usage_page_numbers_say_what_each_member_stores(
    as_user: Callable[..., Api], add_host: Callable[..., None], db: object
) -> None:
    from sqlalchemy import update

    from service.core.models import Job

    add_host("lab-a", 2)
    alice = as_user("alice")
    assert alice.post("/api/code", files={"file": ("a.py", b"x = 1\n" * 100)}).status_code == 201
    job_id = alice.post("/api/jobs", json={"model": "mlp", "dataset": "digits", "gpus": [0]}).json()["id"]
    with db.write() as session:  # as its worker measures it
        session.execute(update(Job).where(Job.id == job_id).values(folder_bytes=5_000_000))
    stored = as_user("bob").get("/api/usage/storage").json()
    assert stored["code_quota_bytes"] == 100_000 and stored["job_folder_max_bytes"] > 0
    assert stored["users"] == [
        {
            "user": "alice",
            "datasets_bytes": 0,
            "code_bytes": 600,
            "job_folders_bytes": 5_000_000,
            "log_bytes": 0,
            "metric_points": 0,
        }
    ]
