"""A job's writable space with a hard size (issue 44, `TOWERQ_JOB_DISK=image`,
`worker.disk`): the measure of `worker.folder` stops a job about a second of its writing
late, and a file it unlinks while it holds it open keeps growing until then. On an image of
the folder's size a write past it fails whatever it is, and `/proc/self/mountinfo` in the
sandbox no longer names the host path of the job's folder. What comes back from the image
is a member's, so the copy trusts none of it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, unmount_beneath, upload_code, wait_for
from towerq.contract.paths import job_folder
from worker import disk, disk_kind
from worker.mountinfo import beneath


def why_no_images() -> str | None:
    with tempfile.TemporaryDirectory() as name:
        return disk_kind.images_work(Path(name))


NO_IMAGES = why_no_images()
pytestmark = pytest.mark.skipif(NO_IMAGES is not None, reason=f"no job disk images here: {NO_IMAGES}")
LIMIT = 20_000_000
NOBODY = (65534, 65534)


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "artifacts" / "job-7"
    folder.mkdir(parents=True)
    (folder / "checkpoint.bin").write_bytes(b"from the last attempt")
    os.chown(folder, *NOBODY)
    return folder, tmp_path / "var" / disk.DISKS


def test_a_write_past_the_size_fails_even_into_a_file_with_no_name(folders: tuple[Path, Path]) -> None:
    folder, disks = folders
    held = None
    job_disk = disk.JobDisk.open(folder, disks, LIMIT, 10_000)
    try:
        assert os.path.ismount(folder) and (folder / "checkpoint.bin").read_bytes() == b"from the last attempt"
        assert folder.stat().st_uid == NOBODY[0], "the folder stays the trainer's"
        assert sorted(os.listdir(folder)) == ["checkpoint.bin"], "no lost+found"
        held = open(folder / "hidden.bin", "wb")  # noqa: SIM115 - held open, unlinked, while it grows
        os.unlink(folder / "hidden.bin")
        block, wrote = os.urandom(2**20), 0
        with pytest.raises(OSError, match="No space left on device"):
            for _ in range(3 * LIMIT // 2**20):
                held.write(block)
                held.flush()
                wrote += len(block)
        assert wrote <= LIMIT, wrote
    finally:
        if held is not None:
            held.close()
        job_disk.close()
    assert not os.path.ismount(folder)
    assert sorted(os.listdir(folder)) == ["checkpoint.bin"] and list(disks.glob("*.img")) == []


def test_what_comes_back_from_the_image_is_copied_without_trusting_it(folders: tuple[Path, Path]) -> None:
    folder, disks = folders
    job_disk = disk.JobDisk.open(folder, disks, LIMIT, 10_000)
    try:
        (folder / "one.bin").write_bytes(os.urandom(3_000_000))
        for name in ("two.bin", "three.bin"):  # 3 MB under three names: 9 MB if copied as three files
            os.link(folder / "one.bin", folder / name)
        with open(folder / "sparse.bin", "wb") as sparse:  # a terabyte of holes in a 20 MB disk
            sparse.seek(10**12)
            sparse.write(b"end")
        with open(folder / "huge.bin", "wb") as huge:  # as large as a file may be on a 4 TB disk
            huge.truncate(2**42)
        os.symlink("/etc/shadow", folder / "shadow")
        os.mkfifo(folder / "fifo")
        (folder / "setuid.sh").write_text("#!/bin/sh\n")
        os.chmod(folder / "setuid.sh", 0o4755)
        hidden = folder / "hidden"
        hidden.mkdir()
        (hidden / "inside.txt").write_text("kept")
        hidden.chmod(0)
    finally:
        job_disk.close()
    assert not os.path.ismount(folder)
    assert sorted(os.listdir(folder)) == [
        "checkpoint.bin", "hidden", "huge.bin", "one.bin", "setuid.sh", "shadow", "sparse.bin", "three.bin", "two.bin",
    ]  # fmt: skip
    one = (folder / "one.bin").stat()
    assert one.st_nlink == 3 and (folder / "three.bin").stat().st_ino == one.st_ino, "one file, three names"
    sparse = (folder / "sparse.bin").stat()
    assert sparse.st_size == 10**12 + 3 and sparse.st_blocks * 512 < 1_000_000, "its holes stay holes"
    assert (folder / "huge.bin").stat().st_size == 2**42, "a small disk's files may be as large as a big one's"
    assert os.readlink(folder / "shadow") == "/etc/shadow", "a link, not /etc/shadow"
    assert stat.S_IMODE((folder / "setuid.sh").stat().st_mode) == 0o755, "no setuid bit comes back"
    assert stat.S_IMODE((folder / "hidden").stat().st_mode) == 0 and (folder / "hidden" / "inside.txt").exists()
    assert list(folder.parent.iterdir()) == [folder], "nothing left beside it"


def test_what_a_reader_holds_open_at_the_end_does_not_keep_the_attempts_writes_from_coming_back(
    folders: tuple[Path, Path],
) -> None:
    folder, disks = folders
    job_disk = disk.JobDisk.open(folder, disks, LIMIT, 10_000)
    written = os.urandom(5_000_000)
    (folder / "last.ckpt").write_bytes(written)  # in the page cache: not on the image yet
    reader = os.open(folder / "checkpoint.bin", os.O_RDONLY)  # the API serving a download
    try:
        job_disk.close()  # the unmount can only be lazy
    finally:
        os.close(reader)
    assert not os.path.ismount(folder)
    assert (folder / "last.ckpt").read_bytes() == written


def test_a_folder_that_cannot_come_back_stays_served_from_its_image_and_comes_back_later(
    folders: tuple[Path, Path],
) -> None:
    folder, disks = folders
    job_disk = disk.JobDisk.open(folder, disks, LIMIT, 10_000)
    (folder / "result.txt").write_text("the attempt's")
    blocker = folder.parent / f".{folder.name}.back"
    blocker.write_text("in the way")  # where the copy goes: it cannot be made
    failed = job_disk.close()
    assert failed is not None and "File exists" in failed, failed
    assert os.path.ismount(folder) and (folder / "result.txt").read_text() == "the attempt's", "still served"
    blocker.unlink()
    assert disk.bring_back_all(disks) == []  # the worker's next start
    assert not os.path.ismount(folder) and (folder / "result.txt").read_text() == "the attempt's"


def test_a_folder_left_on_its_image_by_a_worker_that_died_comes_back_at_the_next_start(
    folders: tuple[Path, Path],
) -> None:
    folder, disks = folders
    job_disk = disk.JobDisk.open(folder, disks, LIMIT, 10_000)
    (folder / "written.txt").write_text("by the attempt the worker lost")
    assert job_disk.lock is not None
    os.close(job_disk.lock)  # the worker dies: its lock goes, its mount stays
    assert os.path.ismount(folder)
    assert disk.bring_back_all(disks) == []
    assert not os.path.ismount(folder) and (folder / "written.txt").read_text() == "by the attempt the worker lost"
    assert list(disks.glob("*.img")) == []


def test_a_worker_sharing_var_does_not_bring_back_a_folder_an_attempt_holds(folders: tuple[Path, Path]) -> None:
    """The attempt holds its job's disk before the worker writes its spec into the folder:
    a second worker's sweep (sharing `var/`) leaves the folder alone meanwhile. (Before, the
    spec went into the dead worker's image while the other worker brought it back: lost.)"""
    folder, disks = folders
    left = disk.JobDisk.open(folder, disks, LIMIT, 10_000)
    (folder / "written.txt").write_text("by attempt 1, whose worker died")
    left.release()  # the worker dies: its lock goes, its mount stays
    held = disk.JobDisk.hold(folder, disks, (7, 2), lambda job, attempt: disk.WAITS, size=2 * LIMIT)
    try:
        assert held.settled == disk.BACK, "an image of another size than this attempt's comes back first"
        assert not os.path.ismount(folder) and (folder / "written.txt").exists()
        (folder / "spec-attempt-2.json").write_text("{}")
        sweep = f"from pathlib import Path; from worker import disk; disk.bring_back_all(Path({str(disks)!r}))"
        subprocess.run([sys.executable, "-c", sweep], check=True)
        assert (folder / "spec-attempt-2.json").exists()
        disk.fill_for(held, Settings(var_dir=disks.parent, job_folder_max_bytes=2 * LIMIT))
        assert os.path.ismount(folder) and (folder / "spec-attempt-2.json").exists()
        assert json.loads((disks / "job-7.folder").read_text()) == {"folder": str(folder), "job": 7, "attempt": 2}
    finally:
        assert held.close() is None
    assert sorted(os.listdir(folder)) == ["checkpoint.bin", "spec-attempt-2.json", "written.txt"]


def test_a_job_that_runs_again_keeps_its_image_for_its_next_attempt_and_it_comes_back_once_the_job_ends(
    folders: tuple[Path, Path],
) -> None:
    """A preempted (or resized) job's folder stays on its image between attempts: no copy
    back at the stop and none in at the restart. The worker's sweep leaves it while the job
    waits, and brings it back once the job ends without another attempt."""
    folder, disks = folders
    settings = Settings(var_dir=disks.parent, job_folder_max_bytes=LIMIT)
    fates = {(7, 1): disk.WAITS}
    first = disk.hold_for(folder, settings, (7, 1), lambda job, attempt: fates[(job, attempt)])
    disk.fill_for(first, settings)
    (folder / "checkpoint.bin").write_bytes(b"attempt 1's")
    assert first.close(keep=True) is None and first.lock is None
    assert os.path.ismount(folder) and (disks / "job-7.img").exists(), "kept, mounted over the folder"
    assert disk.bring_back_all(disks, lambda job, attempt: fates[(job, attempt)]) == []
    assert os.path.ismount(folder), "the sweep leaves a waiting job's image"

    second = disk.hold_for(folder, settings, (7, 2), lambda job, attempt: fates[(job, attempt)])
    assert second.settled == disk.KEPT and second.mounted and second.size == LIMIT, "taken as it is"
    assert (folder / "checkpoint.bin").read_bytes() == b"attempt 1's"
    assert json.loads((disks / "job-7.folder").read_text())["attempt"] == 2
    (folder / "checkpoint.bin").write_bytes(b"attempt 2's")
    assert second.close(keep=True) is None
    fates[(7, 2)] = disk.ENDED  # cancelled while it waited
    assert disk.bring_back_all(disks, lambda job, attempt: fates[(job, attempt)]) == []
    assert not os.path.ismount(folder) and list(disks.glob("*.img")) == []
    assert (folder / "checkpoint.bin").read_bytes() == b"attempt 2's"


def test_the_lock_file_goes_with_the_image_and_attempts_still_hold_it_one_at_a_time(
    folders: tuple[Path, Path],
) -> None:
    """An attempt that leaves no image removes its lock file (else one per job for ever).
    Those that waited on the removed file must not hold it beside one that came after and
    made the file anew: each checks, once it holds the lock, that the file is still there."""
    folder, disks = folders
    first = disk.JobDisk.hold(folder, disks, (7, 1))
    inside, most, guard = [0], [0], threading.Lock()

    def attempt(number: int) -> None:
        held = disk.JobDisk.hold(folder, disks, (7, number))
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.2)
        with guard:
            inside[0] -= 1
        held.release()

    waiting = [threading.Thread(target=attempt, args=(number,)) for number in (2, 3, 4)]
    for thread in waiting:
        thread.start()
    time.sleep(0.3)  # all three wait on the first's lock file
    first.release()  # no image: the file goes
    later = threading.Thread(target=attempt, args=(5,))  # makes the file anew
    later.start()
    for thread in [*waiting, later]:
        thread.join(10)
    assert most[0] == 1, "two attempts held the job's disk at once"
    assert list(disks.iterdir()) == [], "no lock file left behind"


def test_a_folder_another_var_dirs_image_is_mounted_on_is_refused(folders: tuple[Path, Path]) -> None:
    """Two workers of one machine with var/ folders of their own: the second would put its
    image over the first's, and the first's sweep would then unmount the second's."""
    folder, disks = folders
    other = disk.JobDisk.open(folder, disks.parent.parent / "other-var" / disk.DISKS, LIMIT, 10_000)
    try:
        with pytest.raises(disk.DiskError, match="must share TOWERQ_VAR_DIR"):
            disk.JobDisk.hold(folder, disks, (7, 2), lambda job, attempt: disk.WAITS)
    finally:
        other.close()


@pytest.mark.parametrize("fate", [disk.SUPERSEDED, disk.ENDED, disk.WAITS])
def test_an_image_a_later_attempt_superseded_is_dropped_not_brought_back_over_it(
    folders: tuple[Path, Path], fate: str
) -> None:
    """A host died with attempt 1 on its image; on storage several hosts share, attempt 2 ran
    on another host and wrote the folder. The dead host's next start must not copy attempt
    1 back over it; where the job ended, attempt 1's checkpoint comes back; where it waits
    for its next attempt, the image stays for it."""
    folder, disks = folders
    left = disk.JobDisk.hold(folder, disks, (7, 1))
    disk.fill_for(left, Settings(var_dir=disks.parent, job_folder_max_bytes=LIMIT))
    (folder / "checkpoint.bin").write_bytes(b"attempt 1's")
    left.release()  # the worker dies: its lock goes, its mount stays
    asked: list[tuple[int, int]] = []

    def fate_of(job: int, attempt: int) -> str:
        asked.append((job, attempt))
        return fate

    assert disk.bring_back_all(disks, fate_of) == []
    assert asked == [(7, 1)] and os.path.ismount(folder) == (fate == disk.WAITS)
    if fate != disk.WAITS:
        assert list(disks.glob("job-7.*")) == [], "its image, its record and its lock file gone"
    kept = b"from the last attempt" if fate == disk.SUPERSEDED else b"attempt 1's"
    assert (folder / "checkpoint.bin").read_bytes() == kept
    if fate == disk.WAITS:
        assert disk.bring_back_all(disks) == []  # the worker's stop: every folder comes back
        assert not os.path.ismount(folder) and (folder / "checkpoint.bin").read_bytes() == kept


def test_an_image_stays_while_the_database_cannot_say_what_became_of_its_job(folders: tuple[Path, Path]) -> None:
    folder, disks = folders
    left = disk.JobDisk.hold(folder, disks, (7, 1))
    disk.fill_for(left, Settings(var_dir=disks.parent, job_folder_max_bytes=LIMIT))
    (folder / "checkpoint.bin").write_bytes(b"attempt 1's")
    left.release()  # the worker dies

    def no_database(job: int, attempt: int) -> str:
        raise ConnectionError("the database is down")

    assert disk.bring_back_all(disks, no_database) == ["job-7: the database is down"]
    assert os.path.ismount(folder) and (disks / "job-7.img").exists(), "kept for the next sweep"
    assert disk.bring_back_all(disks, lambda job, attempt: disk.ENDED) == []
    assert not os.path.ismount(folder) and (folder / "checkpoint.bin").read_bytes() == b"attempt 1's"


def test_auto_keeps_the_measure_on_network_storage(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /mnt/lab rw,relatime shared:20 - nfs4 server:/lab rw,vers=4.2\n"
        "41 40 8:2 / /mnt/lab/local\\040disk rw,relatime - xfs /dev/sdb1 rw\n"
        "42 22 0:51 / /mnt/bucket rw - fuse.s3fs s3fs rw\n"
    )
    assert disk_kind.network_storage(Path("/mnt/lab/artifacts"), mountinfo) == "nfs4"
    local = Path("/mnt/lab/local disk/artifacts")
    assert disk_kind.network_storage(local, mountinfo) is None, "the deepest mount decides"
    assert (
        disk_kind.network_storage(Path("/mnt/labs"), mountinfo) is None
        and disk_kind.network_storage(Path("/var"), mountinfo) is None
    )
    assert disk_kind.network_storage(Path("/mnt/bucket/a"), mountinfo) == "fuse.s3fs"
    assert disk_kind.network_storage(tmp_path) is None, "this machine's own disk"


def test_a_folder_that_does_not_fit_its_disk_is_refused_by_name(folders: tuple[Path, Path]) -> None:
    folder, disks = folders
    (folder / "big.bin").write_bytes(os.urandom(6_000_000))
    with pytest.raises(disk.DiskError, match="does not fit a disk of 5,000,000 bytes"):
        disk.JobDisk.open(folder, disks, 5_000_000, 10_000)
    assert not os.path.ismount(folder) and (folder / "big.bin").stat().st_size == 6_000_000
    assert list(disks.glob("*.img")) == []


def test_auto_uses_images_where_the_worker_can_make_one_and_image_insists(tmp_path: Path) -> None:
    made = Settings(var_dir=tmp_path / "var")
    assert made.job_disk == "auto", "the default"
    assert disk_kind.in_use(made), "a root worker that mounts a loop image uses one"
    assert "are disk images" in disk_kind.described(made)
    measured = Settings(var_dir=tmp_path / "var", job_disk="measure")
    assert not disk_kind.in_use(measured) and disk_kind.described(measured).endswith("(TOWERQ_JOB_DISK=measure)")
    with pytest.raises(disk.DiskError, match="TOWERQ_JOB_DISK is 'loop': use auto, image, measure"):
        disk_kind.check("loop", tmp_path)


KILLED_IN_ITS_PROBE = r"""
import os, signal, sys
from pathlib import Path
from worker import disk_image, disk_kind

def mount_then_die(image, where, options):
    where.mkdir(mode=0o700)
    disk_image.mount(image, where, options)
    os.kill(os.getpid(), signal.SIGKILL)  # a worker killed between its probe's mount and unmount

disk_kind.mounted_at = mount_then_die
disk_kind.images_work(Path(sys.argv[1]))
"""

PROBING_WHILE_ANOTHER_WAITS = r"""
import fcntl, os, sys, time
from pathlib import Path
from worker import disk_image, disk_kind

var = Path(sys.argv[1])
lock = os.open(var / disk_kind.PROBE_LOCK, os.O_RDWR | os.O_CREAT)
fcntl.flock(lock, fcntl.LOCK_EX)
probe = var / (disk_kind.PROBE_PREFIX + "running")
(probe / "mounted").mkdir(parents=True)
disk_image.make_image(probe / "probe.img", disk_image.MIN_IMAGE_BYTES, disk_image.MIN_INODES)
disk_image.mount(probe / "probe.img", probe / "mounted", disk_image.MOUNT_OPTIONS)
print("probing", flush=True)
time.sleep(1.5)  # the other worker's probe starts meanwhile
print("intact" if os.path.ismount(probe / "mounted") else "unmounted under me", flush=True)
disk_image.unmount(probe / "mounted")
"""


def test_a_worker_killed_in_its_disk_probe_leaves_nothing_mounted_after_the_next_start(tmp_path: Path) -> None:
    var = tmp_path / "var"
    var.mkdir()
    try:
        killed = subprocess.run([sys.executable, "-c", KILLED_IN_ITS_PROBE, str(var)], capture_output=True, text=True)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (left,) = var.glob(f"{disk_kind.PROBE_PREFIX}*")
        assert beneath(var) == [left / "mounted"], "the killed probe's image stays mounted"
        assert disk_kind.images_work.__wrapped__(var) is None, "the next start's probe works"
        assert beneath(var) == [], "and unmounted what the killed one left"
        assert list(var.glob(f"{disk_kind.PROBE_PREFIX}*")) == [], "and removed its folder"
    finally:
        unmount_beneath(var)


def test_workers_sharing_a_var_folder_probe_in_turn_and_leave_a_running_probe_alone(tmp_path: Path) -> None:
    var = tmp_path / "var"
    var.mkdir()
    other = subprocess.Popen(
        [sys.executable, "-c", PROBING_WHILE_ANOTHER_WAITS, str(var)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "probing"
        started = time.monotonic()
        assert disk_kind.images_work.__wrapped__(var) is None
        waited = time.monotonic() - started
        said, _ = other.communicate(timeout=60)
    finally:
        other.kill()
        other.wait()
        unmount_beneath(var)
    assert said.strip() == "intact", "a probe that runs keeps its mount while another worker starts"
    assert waited > 0.5, f"the second probe waited its turn (it took {waited:.2f} s)"
    assert beneath(var) == [] and list(var.glob(f"{disk_kind.PROBE_PREFIX}*")) == []


WRITER = r"""
import errno, json, os
held = open("/job/hidden.bin", "wb")
os.unlink("/job/hidden.bin")  # its blocks have no name: a walk of the folder never sees them
block, wrote, why = os.urandom(2**20), 0, None
try:
    for _ in range(100):  # 100 MB, in well under a second
        held.write(block)
        held.flush()
        wrote += len(block)
except OSError as err:
    why = errno.errorcode.get(err.errno)
held.close()
with open(os.path.join(os.environ["TOWERQ_OUTPUT_DIR"], "report.json"), "w") as out:
    json.dump({"wrote": wrote, "why": why, "mountinfo": open("/proc/self/mountinfo").read()}, out)
"""


FILLER = r"""
with open("/job/output/filler.bin", "wb") as out:  # until the disk is full: OSError, not caught
    while True:
        out.write(b"x" * 2**20)
        out.flush()
"""


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


@pytest.mark.slow
def test_a_command_job_cannot_write_past_its_folder_nor_learn_where_it_lives(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, sandbox="bwrap", job_disk="image", job_folder_max_bytes=LIMIT)
    client = stack.client(make_token("mallory"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    assert client.get("/api/workers").json()[0]["job_disk"] == "image", "the GPUs page says nothing of measures"
    code = upload_code(client, {"writer.py": WRITER, "filler.py": FILLER})
    created = client.post("/api/jobs", json={"command": ["python", "writer.py"], "code": code})
    assert created.status_code == 201, created.text
    job = finished(client, created.json()["id"])
    assert job["state"] == "succeeded", (job["error"], stack.dump_logs())
    folder = job_folder(settings.artifacts_dir, job["id"])
    report = json.loads((folder / "output" / "report.json").read_text())
    assert report["why"] == "ENOSPC" and report["wrote"] <= LIMIT, {k: report[k] for k in ("why", "wrote")}
    job_line = next(line for line in report["mountinfo"].splitlines() if line.split()[4] == "/job")
    assert job_line.split()[3] == "/", job_line  # the filesystem's root, not a host path
    assert str(settings.artifacts_dir.resolve()) not in report["mountinfo"]
    assert not os.path.ismount(folder) and not (settings.var_dir / disk.DISKS / f"{folder.name}.img").exists()
    listed = client.get(f"/api/jobs/{job['id']}/artifacts").json()
    assert "output/report.json" in json.dumps(listed), listed

    filler = client.post("/api/jobs", json={"command": ["python", "filler.py"], "code": code}).json()["id"]
    job = finished(client, filler)
    assert job["state"] == "failed" and job["attempts"] == 1, job  # not retried: it would only fill it again
    assert job["error"] == (
        "failed: its folder's disk is full (20.0 MB, TOWERQ_JOB_FOLDER_MAX_BYTES): what it wrote past that failed"
    ), job["error"]
    client.close()


@pytest.mark.slow
def test_a_trainer_on_its_disk_resumes_from_the_checkpoint_a_killed_worker_left_on_the_image(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    worker = {"sandbox": "bwrap", "job_disk": "image", "job_folder_max_bytes": 200_000_000}
    stack.start_worker("lab-a", 1, **worker)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    hyperparameters = {"steps": 200_000, "batch_size": 16, "checkpoint_every": 100, "log_every": 10}
    job_id = client.post(
        "/api/jobs", json={"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": hyperparameters}
    ).json()["id"]

    def said(words: str) -> list[str]:
        return [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json() if words in line["message"]]

    wait_for(lambda: said("checkpoint at step "), 180, "a checkpoint", 0.5)
    folder = job_folder(settings.artifacts_dir, job_id)
    assert os.path.ismount(folder)
    stack.stop("worker-lab-a", signal.SIGKILL)  # its trainer dies with it; the folder stays on its image
    assert os.path.ismount(folder)
    stack.start_worker("lab-a", 1, **worker)
    resumed = wait_for(lambda: said("resumed from the checkpoint of step "), 180, "the next attempt to resume", 0.5)
    assert int(resumed[0].split()[-1]) >= 100, resumed
    client.post(f"/api/jobs/{job_id}/cancel")
    assert finished(client, job_id)["state"] == "cancelled"
    image = settings.var_dir / disk.DISKS / f"{folder.name}.img"
    wait_for(lambda: not image.exists(), 30, "the folder back on the host's disk")  # the image goes last
    assert not os.path.ismount(folder) and list((folder / "checkpoints").iterdir()), "its checkpoints came back"
    client.close()


@pytest.mark.slow
def test_a_preempted_job_keeps_its_folder_on_its_image_until_it_runs_again_or_ends(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    """No copy of a preempted job's folder back onto the host's disk and in again at its
    restart: it stays on its image, mounted (the API serves it there), while the job waits;
    its next attempt resumes from what is on it; cancelled while it waits, the worker's
    sweep brings it back."""
    stack.start_api()
    stack.start_scheduler(preemption=True)
    stack.start_worker("lab-a", 1, sandbox="bwrap", job_disk="image", job_folder_max_bytes=200_000_000)
    bob, alice = stack.client(make_token("bob")), stack.client(make_token("alice", admin=True))  # high: an admin's
    wait_for(lambda: bob.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    long = {"steps": 200_000, "batch_size": 16, "checkpoint_every": 50, "log_every": 10}
    spec = {"model": "mlp", "dataset": "digits", "gpu_count": 1}
    low = bob.post("/api/jobs", json={**spec, "priority": "low", "hyperparameters": long}).json()["id"]
    folder, image = job_folder(settings.artifacts_dir, low), settings.var_dir / disk.DISKS / f"job-{low}.img"

    def said(words: str) -> list[str]:
        return [line["message"] for line in bob.get(f"/api/jobs/{low}/logs").json() if words in line["message"]]

    def state() -> str:
        return bob.get(f"/api/jobs/{low}").json()["state"]

    def preempt() -> dict:
        """A high-priority job stops the low one: its folder stays on its image meanwhile."""
        high = alice.post("/api/jobs", json={**spec, "priority": "high", "hyperparameters": {"steps": 30}})
        assert high.status_code == 201, high.text
        wait_for(lambda: state() == "queued", 120, "the low job preempted", 0.3)
        assert os.path.ismount(folder) and image.exists(), "kept on its image while it waits"
        assert bob.get(f"/api/jobs/{low}/artifacts").status_code == 200, "served from there"
        return high.json()

    wait_for(lambda: said("checkpoint at step "), 180, "attempt 1's checkpoint", 0.5)
    assert finished(alice, preempt()["id"])["state"] == "succeeded"
    resumed = wait_for(lambda: said("resumed from the checkpoint of step "), 180, "attempt 2 to resume", 0.5)
    assert int(resumed[0].split()[-1]) >= 50, resumed
    assert f"job-{low}: on the disk its last attempt kept (no copy)" in stack.dump_logs()
    checkpoints = len(said("checkpoint at step "))
    wait_for(lambda: len(said("checkpoint at step ")) > checkpoints, 180, "attempt 2's checkpoint", 0.5)
    preempt()
    assert bob.post(f"/api/jobs/{low}/cancel").status_code in (200, 202)
    assert finished(bob, low)["state"] == "cancelled"
    wait_for(lambda: not image.exists(), disk.SWEEP_S + 30, "the worker's sweep to bring the folder back")
    assert not os.path.ismount(folder) and list((folder / "checkpoints").iterdir()), "its checkpoints came back"
    bob.close()
    alice.close()


@pytest.mark.slow
def test_a_warm_trainer_waits_on_a_disk_of_its_own_which_its_job_takes(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 1, sandbox="bwrap", job_disk="image", job_folder_max_bytes=50_000_000, trainer_pool=1)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    disks = settings.var_dir / disk.DISKS
    slots = settings.artifacts_dir.resolve() / ".warm"

    def warm_disks() -> list[Path]:
        return [slot for slot in slots.iterdir() if os.path.ismount(slot)] if slots.is_dir() else []

    assert wait_for(warm_disks, 60, "a warm trainer on its disk")

    def ready() -> int:
        workers = client.get("/api/workers").json()
        return workers[0]["info"].get("warm_trainers", 0) if workers else 0

    wait_for(lambda: ready() == 1, 120, "the warm trainer to be ready", 0.3)
    spec = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 20, "log_every": 5}}
    job_id = client.post("/api/jobs", json=spec).json()["id"]
    job = finished(client, job_id)
    log = [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs").json()]
    assert job["state"] == "succeeded", (job["error"], log[-20:])
    assert any("in a warm trainer from the pool" in m for m in log), log[:5]
    folder = job_folder(settings.artifacts_dir, job_id)
    assert not os.path.ismount(folder) and not (disks / f"{folder.name}.img").exists()
    assert (folder / "model.keras").is_file() or list(folder.rglob("*.keras")), sorted(os.listdir(folder))
    stack.stop("worker-lab-a")
    assert warm_disks() == [] and list(disks.glob("*.img")) == [], "the next warm trainer's disk went with it"
    client.close()
