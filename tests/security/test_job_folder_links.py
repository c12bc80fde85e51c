"""Attacks through a job folder: its trainer writes it, so any name there may be a link to
towerq's own files (the admin token, the database), a FIFO or a hard link. What towerq
itself reads or writes there must never reach past the folder, also when the name is
swapped between a check and the open. Each case failed before the job folder was opened
link by link (towerq/contract/paths.py)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.core.attempts import LocalChannel
from service.core.context import Context
from service.core.settings import Settings
from tests.service.api.conftest import Api
from towerq.contract.paths import JOB_LOG_FILE, UnsafeFileError, job_folder, read_beneath
from worker.launch import Launch, write_trainer_spec
from worker.relay import MetricSink

SECRET = "tq_admin_secret_never_served"
SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0]}


@pytest.fixture
def secret(settings: Settings) -> Path:
    token = settings.var_dir / "admin-token"
    token.write_text(SECRET)
    return token


@pytest.fixture
def folder(alice: Api, settings: Settings) -> tuple[int, Path]:
    job_id = alice.post("/api/jobs", json=SPEC).json()["id"]
    folder = job_folder(settings.artifacts_dir, job_id)
    folder.mkdir(parents=True)
    return job_id, folder


def test_a_log_linked_to_the_admin_token_is_not_served(alice: Api, secret: Path, folder: tuple[int, Path]) -> None:
    job_id, path = folder
    (path / JOB_LOG_FILE).symlink_to(secret)
    whole = alice.get(f"/api/jobs/{job_id}/logs.txt")
    assert whole.status_code == 200 and SECRET not in whole.text
    one = alice.get(f"/api/jobs/{job_id}/artifacts/{JOB_LOG_FILE}")
    assert one.status_code == 422 and SECRET not in one.text
    assert JOB_LOG_FILE not in [item["path"] for item in alice.get(f"/api/jobs/{job_id}/artifacts").json()["items"]]


def test_tensorboard_events_planted_as_links_are_not_served(
    alice: Api, settings: Settings, secret: Path, folder: tuple[int, Path]
) -> None:
    """`tensorboard.tar.gz` gathers event files from anywhere in the folder: a link named as
    one, a linked folder of them, or a hard link to the token is left out, never followed."""
    job_id, path = folder
    (path / "runs").mkdir()
    (path / "runs" / "events.out.tfevents.1.lab-a").symlink_to(secret)
    (path / "plugins").symlink_to(settings.var_dir)
    (path / "linked_runs").symlink_to(settings.var_dir, target_is_directory=True)
    (settings.var_dir / "events.out.tfevents.2.lab-a").write_text(SECRET)
    try:
        os.link(secret, path / "events.out.tfevents.3.lab-a")
    except OSError:
        pass  # another file system: the hard link cannot be planted here
    (path / "runs" / "events.out.tfevents.4.lab-a").write_bytes(b"curves")
    response = alice.get(f"/api/jobs/{job_id}/tensorboard.tar.gz")
    assert response.status_code == 200 and SECRET.encode() not in gzip.decompress(response.content)
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        assert archive.getnames() == [f"job-{job_id}/runs/events.out.tfevents.4.lab-a"]


def test_appending_to_a_planted_log_link_leaves_its_target_alone(
    settings: Settings, secret: Path, folder: tuple[int, Path]
) -> None:
    """The relay (and the webhook deliverer, through the same `joblog.append`) appended
    to the folder's `log.txt`: a link to a `.pth` file would run the appended text in every
    towerq process. The log now lives outside the folder; a link there changes nothing."""
    job_id, path = folder
    (path / JOB_LOG_FILE).symlink_to(secret)
    row = {"time": datetime.now(UTC), "attempt": 1, "level": "info", "message": "import os; os.system('id')"}
    ctx = Context.open(settings)
    try:
        MetricSink(LocalChannel(ctx, job_id, 1), settings)._append_log_file([row])
    finally:
        ctx.close()
    assert secret.read_text() == SECRET


def test_a_fifo_for_a_log_neither_hangs_the_writer_nor_the_reader(
    alice: Api, settings: Settings, folder: tuple[int, Path]
) -> None:
    """Opening a FIFO to write waits for a reader that never comes: the relay's thread (and
    with it every later log line of the job) would hang."""
    job_id, path = folder
    os.mkfifo(path / JOB_LOG_FILE)
    row = {"time": datetime.now(UTC), "attempt": 1, "level": "info", "message": "hello"}
    ctx = Context.open(settings)
    sink = MetricSink(LocalChannel(ctx, job_id, 1), settings)
    writer = threading.Thread(target=sink._append_log_file, args=([row],), daemon=True)
    writer.start()
    writer.join(5)
    hung = writer.is_alive()
    if hung:
        os.close(os.open(path / JOB_LOG_FILE, os.O_RDONLY | os.O_NONBLOCK))  # let the thread go
    ctx.close()
    assert not hung, "appending to a FIFO hung"
    started = time.monotonic()
    assert alice.get(f"/api/jobs/{job_id}/logs.txt").status_code == 200
    assert time.monotonic() - started < 5


def test_a_folder_swapped_for_a_link_out_is_not_followed(
    alice: Api, settings: Settings, secret: Path, folder: tuple[int, Path]
) -> None:
    """A guard more than an attack that worked: a link planted before the request was
    refused before too; the race (a swap between the check and the open) is closed by the
    same link-by-link open."""
    job_id, path = folder
    (path / "checkpoints").symlink_to(settings.var_dir)
    for url in ("artifacts/checkpoints/admin-token", "artifacts/checkpoints", "artifacts.tar.gz"):
        response = alice.get(f"/api/jobs/{job_id}/{url}")
        assert SECRET.encode() not in response.content, url
    assert alice.get(f"/api/jobs/{job_id}/artifacts/checkpoints/admin-token").status_code in (404, 422)


def test_a_hard_link_to_a_file_outside_is_neither_listed_nor_served(
    alice: Api, secret: Path, folder: tuple[int, Path]
) -> None:
    job_id, path = folder
    os.link(secret, path / "token-copy")  # without the sandbox a trainer can do this on one file system
    assert alice.get(f"/api/jobs/{job_id}/artifacts/token-copy").status_code == 422
    assert alice.get(f"/api/jobs/{job_id}/artifacts").json()["items"] == []
    assert SECRET.encode() not in alice.get(f"/api/jobs/{job_id}/artifacts.tar.gz").content


def test_a_retry_spec_never_truncates_what_a_link_points_at(settings: Settings, secret: Path, tmp_path: Path) -> None:
    """The trainer can force a retry (kill its own bwrap) after planting the next attempt's
    spec file as a link to the database."""
    folder = tmp_path / "job-7"
    folder.mkdir()
    (folder / "spec-attempt-2.json").symlink_to(secret)
    launch = Launch(7, 2, "lab-a", [0], 1.0, SPEC, None, [0], True)
    written = write_trainer_spec(launch, settings, folder, sandboxed=True)
    assert secret.read_text() == SECRET
    assert not written.is_symlink() and '"job_id": 7' in written.read_text()


def test_the_worker_reads_back_no_metrics_log_through_a_link(tmp_path: Path) -> None:
    """A resumed job's points come back from the trainer's `metrics.jsonl`: a link to
    /dev/zero would make that read endless, a link to a secret would leak it."""
    (tmp_path / "metrics.jsonl").symlink_to("/dev/zero")
    with pytest.raises(UnsafeFileError):
        read_beneath(tmp_path, "metrics.jsonl", 1024)
    (tmp_path / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").write_bytes(b"x" * 10_000)
    assert len(read_beneath(tmp_path, "metrics.jsonl", 1024)) == 1024
