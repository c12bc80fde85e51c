"""A job folder's size is what its walk sees, and a trainer could hide space from the walk
(issue 44): a file it unlinks while it holds it open (or mapped) keeps its blocks on the
disk that also holds towerq's var/ and database (3 GB written so went uncounted), and a
folder set to mode 000 hides what it holds from a worker that is not root (the Docker
image's `USER towerq`: the trainer is the worker's uid there). Both count now
(`worker.folder`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import Stack, wait_for
from worker import folder
from worker.folder import FolderWatch

NOBODY = (65534, 65534)
LIMIT = 2_000_000
FINAL = ("succeeded", "failed", "cancelled")

HOLDER = """
import os, sys, time
path = sys.argv[1]
with open(path, "wb") as out:
    out.write(os.urandom(3_000_000))
    out.flush()
    os.fsync(out.fileno())
    os.unlink(path)
    print("ready", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path / "job" / "hidden.bin")], stdout=subprocess.PIPE, text=True
        )
        started.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        return process

    (tmp_path / "job").mkdir()
    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_deleted_file_its_process_holds_open_counts_against_the_folder(
    tmp_path: Path, holder: Callable[[], subprocess.Popen[str]]
) -> None:
    process = holder()
    watch = FolderWatch(tmp_path / "job", LIMIT, 1.0)
    assert watch.measure(0.0) is None, "the walk alone sees an empty folder"
    over = watch.measure(1.0, {process.pid})
    assert over is not None and "in deleted files its processes hold open" in over, over
    assert watch.bytes is not None and watch.bytes >= 3_000_000
    assert watch.measure(2.0, {os.getpid()}) is None, "another process's files are not the job's"


@pytest.mark.skipif(os.geteuid() != 0, reason="/proc/PID/map_files is read by a root worker")
def test_a_deleted_file_kept_only_as_a_mapping_counts_too(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    mapper = (  # libc's mmap: Python's mmap keeps a handle of its own on the file
        "import ctypes, os, sys, time\n"
        "libc = ctypes.CDLL(None, use_errno=True); libc.mmap.restype = ctypes.c_void_p\n"
        "c = ctypes; libc.mmap.argtypes = [c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_int, c.c_long]\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
        "os.write(fd, os.urandom(3_000_000)); os.fsync(fd)\n"
        "assert libc.mmap(None, 3_000_000, 1, 1, fd, 0) not in (None, ctypes.c_void_p(-1).value)\n"
        "os.close(fd); os.unlink(sys.argv[1])\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    command = [sys.executable, "-c", mapper, str(job / "mapped.bin")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        fds = os.listdir(f"/proc/{process.pid}/fd")
        assert not any("mapped.bin" in os.readlink(f"/proc/{process.pid}/fd/{n}") for n in fds), "no handle on it left"
        over = FolderWatch(job, LIMIT, 1.0).measure(0.0, {process.pid})
        assert over is not None and "deleted files" in over, over
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def lab() -> Iterator[Path]:
    """A folder nobody may look through, with this module's measure beside it (stdlib only)."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as name:
        root = Path(name)
        root.chmod(0o755)
        shutil.copy(folder.__file__, root / "folder.py")
        yield root


def measured_by_nobody(lab: Path) -> list[str]:
    """The reason and bytes `FolderWatch` gives for lab/job, run as a worker that is not root."""
    measure = (
        f"import sys, pathlib; sys.path.insert(0, {str(lab)!r}); from folder import FolderWatch; "
        f"w = FolderWatch(pathlib.Path({str(lab / 'job')!r}), {LIMIT}, 1.0); print(w.measure(0.0)); print(w.bytes)"
    )
    uid, gid = NOBODY
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", "/usr/bin/python3", "-c", measure],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="plays a worker that is not root through setpriv, which needs root")
def test_a_folder_whose_mode_hides_it_is_measured_by_a_worker_that_is_not_root(lab: Path) -> None:
    job = lab / "job"
    hidden = job / "a" / "hidden"
    hidden.mkdir(parents=True)
    (hidden / "filler.bin").write_bytes(os.urandom(3_000_000))
    for path in (job, job / "a", hidden, hidden / "filler.bin"):
        os.chown(path, *NOBODY)
    hidden.chmod(0)  # as the trainer (the worker's own uid) would
    over, measured = measured_by_nobody(lab)
    assert "over the 2.0 MB" in over and int(measured) >= 3_000_000, (over, measured)


@pytest.mark.skipif(os.geteuid() != 0, reason="plays a worker that is not root through setpriv, which needs root")
def test_a_folder_that_is_not_the_workers_and_hides_itself_stops_the_job(lab: Path) -> None:
    job = lab / "job"
    (job / "theirs").mkdir(parents=True)
    os.chown(job, *NOBODY)
    (job / "theirs").chmod(0)  # root's, so the worker (nobody) cannot give it back
    over, _ = measured_by_nobody(lab)
    assert "a folder towerq cannot read, so cannot measure: theirs" in over, over


UNLINKER = """
import os
import time

import keras


def build(params):
    held = open("held.bin", "wb")  # in the job's folder, its working folder
    os.unlink("held.bin")  # before it writes: the worker never sees the bytes under a name
    held.write(os.urandom(3_000_000))
    held.flush()
    os.fsync(held.fileno())
    build.held = held  # kept open while it trains
    time.sleep(4)  # the worker measures every second here
    return keras.Sequential([keras.Input(params["input_shape"]), keras.layers.Flatten(),
                             keras.layers.Dense(params["num_classes"])])
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    made = make_settings(sqlite_url)
    made.models_path.mkdir(parents=True, exist_ok=True)
    (made.models_path / "unlinker.py").write_text(UNLINKER)
    return made


@pytest.mark.slow
def test_a_trainer_that_hides_its_writes_in_a_deleted_file_is_stopped(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, trainer_pool=0, job_folder_max_bytes=LIMIT, job_folder_check_s=1)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    spec = {"model": "unlinker:build", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 3}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 0.5)
    assert job["state"] == "failed", job
    assert "in deleted files its processes hold open" in job["error"], job["error"]
    assert "TOWERQ_JOB_FOLDER_MAX_BYTES" in job["error"]
    client.close()


def test_a_folder_growing_fast_towards_its_limit_is_measured_sooner(tmp_path: Path) -> None:
    """A job could write for TOWERQ_JOB_FOLDER_CHECK_S (30 s) past its limit between two
    measures; while it grows towards it the next measure comes at half the time its growth
    would take to reach it, at least MIN_CHECK_S apart."""
    job = tmp_path / "job"
    job.mkdir()
    watch = FolderWatch(job, 10_000_000, 30.0)
    assert watch.measure(0.0) is None and watch.next_at == folder.SECOND_CHECK_S
    (job / "a.bin").write_bytes(os.urandom(2_000_000))  # 2 MB in 5 s: 8 MB left, at 0.4 MB/s 20 s
    assert watch.measure(5.0) is None
    assert watch.next_at == pytest.approx(5.0 + 10.0, abs=0.5), watch.next_at
    (job / "b.bin").write_bytes(os.urandom(6_000_000))  # 6 MB in 10 s: 2 MB left, at 0.6 MB/s 3.3 s
    assert watch.measure(15.0) is None
    assert watch.next_at == pytest.approx(15.0 + 1.7, abs=0.3), watch.next_at
    (job / "c.bin").write_bytes(os.urandom(3_000_000))
    assert watch.measure(17.0) is not None, "past the limit: stopped"
    quiet = FolderWatch(job, 100_000_000, 30.0)  # far below its limit, or not growing: every 30 s
    quiet.measure(0.0)
    quiet.measure(5.0)
    assert quiet.next_at == 35.0
