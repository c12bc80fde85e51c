"""Serving a job's artifacts: the files a worker wrote into `TOWERQ_ARTIFACTS_DIR/job-<id>/`
(written here by the test, as a worker on shared storage would), listed, one by one with
ranges, folders as .tar.gz streams, the whole log; nothing outside the job's folder."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.service.api.conftest import Api
from towerq.contract.paths import JOB_LOG_FILE, job_folder, job_log

SPEC = {"model": "mlp", "dataset": "digits", "gpus": [0]}


@pytest.fixture
def job(alice: Api, settings: Settings) -> tuple[int, Path]:
    job_id = alice.post("/api/jobs", json=SPEC).json()["id"]
    folder = job_folder(settings.artifacts_dir, job_id)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "ckpt-10.index").write_bytes(b"index")
    (folder / "checkpoints" / "ckpt-10.data-00000-of-00001").write_bytes(os.urandom(300_000))
    (folder / "model.keras").write_bytes(bytes(range(256)) * 40)
    log = job_log(settings.artifacts_dir, job_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("2026-11-23T10:00:00.000000Z attempt 1 info    hello\n")
    return job_id, folder


def test_the_artifacts_are_listed_with_sizes_and_times(alice: Api, job: tuple[int, Path]) -> None:
    job_id, folder = job
    listing = alice.get(f"/api/jobs/{job_id}/artifacts").json()
    paths = [item["path"] for item in listing["items"]]
    assert paths == [
        "checkpoints/ckpt-10.data-00000-of-00001",
        "checkpoints/ckpt-10.index",
        JOB_LOG_FILE,
        "model.keras",
    ]
    sizes = {item["path"]: item["size"] for item in listing["items"]}
    assert sizes["model.keras"] == 10_240 and listing["total_bytes"] == sum(sizes.values())
    assert listing["truncated"] is False and all(item["modified"] for item in listing["items"])


def test_a_file_downloads_whole_or_by_range(alice: Api, job: tuple[int, Path]) -> None:
    job_id, folder = job
    whole = alice.get(f"/api/jobs/{job_id}/artifacts/model.keras")
    assert whole.status_code == 200 and whole.content == (folder / "model.keras").read_bytes()
    assert 'filename="model.keras"' in whole.headers["content-disposition"]
    assert "x-towerq-archive" not in whole.headers
    part = alice.get(f"/api/jobs/{job_id}/artifacts/model.keras", headers={"Range": "bytes=256-511"})
    assert part.status_code == 206 and part.content == bytes(range(256))
    assert part.headers["content-range"] == "bytes 256-511/10240"


def test_a_folder_and_the_whole_job_come_as_tar_gz_streams(alice: Api, job: tuple[int, Path]) -> None:
    job_id, folder = job
    folder_response = alice.get(f"/api/jobs/{job_id}/artifacts/checkpoints")
    assert folder_response.headers["x-towerq-archive"] == "folder"
    with tarfile.open(fileobj=io.BytesIO(folder_response.content), mode="r:gz") as archive:
        names = archive.getnames()
        data = archive.extractfile(f"job-{job_id}-checkpoints/ckpt-10.data-00000-of-00001")
        assert data is not None and data.read() == (folder / "checkpoints/ckpt-10.data-00000-of-00001").read_bytes()
    assert sorted(names) == [
        f"job-{job_id}-checkpoints/ckpt-10.data-00000-of-00001",
        f"job-{job_id}-checkpoints/ckpt-10.index",
    ]
    everything = alice.get(f"/api/jobs/{job_id}/artifacts.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(everything.content), mode="r:gz") as archive:
        assert f"job-{job_id}/model.keras" in archive.getnames() and len(archive.getnames()) == 4


def test_the_tensorboard_events_come_from_wherever_the_job_wrote_them(alice: Api, job: tuple[int, Path]) -> None:
    """towerq's trainer writes `tensorboard/`; a program, where its library does (PyTorch's
    `runs/`, Lightning's `lightning_logs/`) in its working folder, or its output folder."""
    job_id, folder = job
    assert alice.get(f"/api/jobs/{job_id}/tensorboard.tar.gz").status_code == 404  # none yet: says so
    events = {
        "work/runs/Dec07_01-16-34_vm/events.out.tfevents.1796606194.vm.2.0": b"loss",
        "work/lightning_logs/version_0/events.out.tfevents.1796606195.vm.3.0": b"acc",
        "output/tb/plugins/profile/2026_12_07/vm.xplane.pb": b"trace",
        "tensorboard/events.out.tfevents.1796606196.vm.4.0.v2": b"trainer",
    }
    for path, data in events.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    (folder / "work" / "runs" / "notes.txt").write_text("not an event file")
    response = alice.get(f"/api/jobs/{job_id}/tensorboard.tar.gz")
    assert response.status_code == 200 and response.headers["x-towerq-archive"] == "folder"
    assert 'filename="job-' in response.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        got = {name: archive.extractfile(name).read() for name in archive.getnames()}  # type: ignore[union-attr]
    assert got == {f"job-{job_id}/{path}": data for path, data in events.items()}


def test_nothing_outside_the_job_folder_is_served(alice: Api, job: tuple[int, Path], settings: Settings) -> None:
    job_id, folder = job
    other = alice.post("/api/jobs", json=SPEC).json()["id"]
    secret = job_folder(settings.artifacts_dir, other) / "secret.txt"
    secret.parent.mkdir(parents=True)
    secret.write_text("another job's")
    (folder / "escape").symlink_to(secret.parent)
    (folder / "escape.txt").symlink_to(secret)
    for path in (f"..%2Fjob-{other}%2Fsecret.txt", "escape/secret.txt", "escape.txt", "%2Fetc%2Fpasswd"):
        response = alice.get(f"/api/jobs/{job_id}/artifacts/{path}")
        assert response.status_code == 422, (path, response.status_code, response.text)
        assert "another job's" not in response.text and response.json()["detail"][0]["msg"].startswith("path: ")
    listing = [item["path"] for item in alice.get(f"/api/jobs/{job_id}/artifacts").json()["items"]]
    assert not [path for path in listing if path.startswith("escape")]  # links are not followed
    with tarfile.open(fileobj=io.BytesIO(alice.get(f"/api/jobs/{job_id}/artifacts.tar.gz").content)) as archive:
        assert not [name for name in archive.getnames() if "escape" in name]
    assert alice.get(f"/api/jobs/{job_id}/artifacts/nope.bin").status_code == 404
    assert alice.get("/api/jobs/999/artifacts").status_code == 404


def test_a_job_that_never_ran_has_an_empty_list_and_no_archive(alice: Api) -> None:
    job_id = alice.post("/api/jobs", json=SPEC).json()["id"]
    assert alice.get(f"/api/jobs/{job_id}/artifacts").json() == {"items": [], "total_bytes": 0, "truncated": False}
    missing = alice.get(f"/api/jobs/{job_id}/artifacts.tar.gz")
    assert missing.status_code == 404 and "no artifacts yet" in missing.json()["detail"]


def test_the_whole_log_comes_from_the_log_file(alice: Api, job: tuple[int, Path]) -> None:
    job_id, _ = job
    text = alice.get(f"/api/jobs/{job_id}/logs.txt")
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text == "2026-11-23T10:00:00.000000Z attempt 1 info    hello\n"


def test_the_log_is_towerqs_not_the_jobs(alice: Api, job: tuple[int, Path]) -> None:
    """The whole log lives outside the job folder; a `log.txt` the job wrote itself gives
    way to it in the list, the downloads and the archive."""
    job_id, folder = job
    (folder / JOB_LOG_FILE).write_text("forged by the job\n")
    listed = [item["path"] for item in alice.get(f"/api/jobs/{job_id}/artifacts").json()["items"]]
    assert listed.count(JOB_LOG_FILE) == 1
    assert alice.get(f"/api/jobs/{job_id}/artifacts/{JOB_LOG_FILE}").text.endswith("hello\n")
    assert "forged" not in alice.get(f"/api/jobs/{job_id}/logs.txt").text
    with tarfile.open(fileobj=io.BytesIO(alice.get(f"/api/jobs/{job_id}/artifacts.tar.gz").content)) as archive:
        member = archive.extractfile(f"job-{job_id}/{JOB_LOG_FILE}")
        assert member is not None and member.read().endswith(b"hello\n")
        assert archive.getnames().count(f"job-{job_id}/{JOB_LOG_FILE}") == 1


def test_a_job_run_before_the_log_moved_keeps_its_log(alice: Api, settings: Settings) -> None:
    job_id = alice.post("/api/jobs", json=SPEC).json()["id"]
    folder = job_folder(settings.artifacts_dir, job_id)
    folder.mkdir(parents=True)
    (folder / JOB_LOG_FILE).write_text("an older job's line\n")
    assert alice.get(f"/api/jobs/{job_id}/logs.txt").text == "an older job's line\n"
    assert [item["path"] for item in alice.get(f"/api/jobs/{job_id}/artifacts").json()["items"]] == [JOB_LOG_FILE]


def test_artifacts_need_a_token(client, job: tuple[int, Path]) -> None:
    job_id, _ = job
    for path in ("artifacts", "artifacts/model.keras", "artifacts.tar.gz", "logs.txt"):
        assert client.get(f"/api/jobs/{job_id}/{path}").status_code == 401, path
