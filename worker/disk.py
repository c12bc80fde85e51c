"""A job's writable space with a hard size (`TOWERQ_JOB_DISK`: `auto`, the default, `image`,
`measure`).

The measure of `worker.folder` stops a job past `TOWERQ_JOB_FOLDER_MAX_BYTES`, about a
second of its writing late. With an image the job's folder is, while an attempt runs, an
ext4 filesystem of exactly that size of its own (`worker.disk_image`): a sparse file under
`TOWERQ_VAR_DIR/disks/`, given a copy of the folder's contents (`fill_image`) and mounted
(a loop device; `nosuid`, `nodev`) over the job's folder, so the API, the job's
TensorBoard and the relay read it where they always did. What the job writes past the size
fails there (ENOSPC), whatever it is: files it unlinked and holds open, folders whose mode
hides them, files under any name. In the sandbox `/proc/self/mountinfo` then names the
filesystem's root (`/`), not the host path of the job's folder.

When the attempt's processes are gone the worker brings the folder back onto the host's
disk (`bring_back`): what the image holds is copied, where it is mounted, into a new folder
beside the job's, which takes its place once the image is unmounted; then the image goes.
The copy (`worker.tree_copy`) is of what a member wrote, so it trusts nothing: links are
copied as links, never followed; FIFOs, sockets and devices are left out; a file's holes
stay holes (a sparse file of a terabyte in a gigabyte image takes a gigabyte at most); hard
links stay one file; no setuid, setgid or sticky bit comes back. The image is removed only
once the folder is back, so a worker that dies on the way (or a host that reboots) leaves
it for its sweep or the job's next attempt.

A job stopped to run again (preempted, time-sliced, resized) keeps its folder on its image,
mounted over the folder, while it waits: its next attempt on this host takes the image as
it is (`JobDisk.hold`: no copy out at the stop nor in at the restart, 0.5 ms against a
quarter of a second for 100 MB and 3.8 s for 1 GB, `bench/job_disk.py`). Every `SWEEP_S`
(and at its start) the worker settles the images no attempt holds (`bring_back_all`,
asking the database what became of each job, `Fate`): a job that ended without another
attempt (cancelled while it waited) gets its folder back; one that waits keeps it; at the
worker's stop every folder comes back (and when `towerq up` had to kill its worker, it
brings them back itself: `service.cli.up`).

One attempt of a job holds its image at a time (an flock beside it, across processes), from
before the worker first writes into the folder (its spec) to the folder's return: the next
attempt of the same job on this machine, or a worker sharing `var/` that sweeps what a dead
one left, waits until the last one is done with it. Beside the image its record names the
job and attempt: an image whose job has run a later attempt since (on another host, on
storage several hosts share) is dropped, not brought back over what that attempt wrote.
The workers of one machine share `TOWERQ_VAR_DIR` (its `disks/`): a folder another one's
image is mounted on is refused, not covered by a second image.
Which of the two a worker uses (`auto`, `image`, `measure`) is `worker.disk_kind`'s. With
`image` on network storage a job stopped to run again comes back at once, not kept
(`keeps_between_attempts`). A job over several
hosts keeps the measure: its ranks share one folder on the lab's storage; so does a Slurm
node's runner, which has no database to ask whether an image was superseded. A warm trainer
(`worker.pool`) is started before its job is known, on a disk of its own (its folder,
shown at `/job`); the job that takes it takes the disk (`JobDisk.move_to`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from service.core.settings import Settings
from worker.disk_image import (
    MIN_IMAGE_BYTES,
    MOUNT_OPTIONS,
    DiskError,
    copy_back,
    fill_image,
    make_image,
    mount,
    run,
    unmount,
)
from worker.disk_kind import network_storage
from worker.folder import JOB_FOLDER_MAX_ENTRIES

log = logging.getLogger(__name__)

SWEEP_S = 30.0
"""How often a worker settles the images no attempt holds (`bring_back_all`)."""
SUPERSEDED, WAITS, ENDED = "superseded", "waits", "ended"
Fate = Callable[[int, int], str]
"""What became of job (first) since its attempt (second), as the database says
(`service.core.lifecycle.attempt_fate`): `SUPERSEDED` (a later attempt has run), `WAITS` (it
runs again: queued, dispatched, or its worker died), `ENDED` (a final state, or no job)."""
KEPT, BACK, DROPPED, NONE = "kept", "back", "dropped", "none"
"""What `settle` did with an image an earlier attempt left."""
DISKS = "disks"
"""The images' folder, in `TOWERQ_VAR_DIR`."""
FULL_BELOW = 2**20
"""A disk with less room than this (or 1 % of its size) is full: ext4 keeps its last blocks
for its own metadata, so a disk a job filled rarely shows 0."""


class JobDisk:
    """One attempt's hold on its job folder's disk: `hold` (the job's lock, taken before the
    worker writes into the folder), then `fill` (or a warm trainer's disk `move_to` it), then
    `close` once the attempt's processes are gone."""

    def __init__(self, folder: Path, disks: Path, lock: int, job: tuple[int, int] | None) -> None:
        self.folder = folder
        self.disks = disks
        self.lock: int | None = lock
        self.job = job
        """The job and attempt, for the record beside the image (None: a warm trainer's slot)."""
        self.size = 0
        self.mounted = False
        """Its folder is on its image now (`fill`, `move_to`)."""
        self.settled = NONE
        """What `hold` did with an image an earlier attempt left (`settle`)."""
        self.dropped: str | None = None
        """What `hold` found and dropped: an earlier attempt's image that a later one superseded."""

    @classmethod
    def hold(
        cls,
        folder: Path,
        disks: Path,
        job: tuple[int, int] | None = None,
        fate: Fate | None = None,
        size: int | None = None,
    ) -> JobDisk:
        """Take the lock of `folder`'s disk (waiting while another attempt of the job holds
        it) and settle what an earlier attempt left on an image (`settle`): an image of
        `size` still mounted over the folder, whose job waited for this attempt, is this
        attempt's at once (no copy either way). DiskError when what was left cannot come back."""
        disks.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = _lock(disks, folder.name)
        held = cls(folder, disks, lock, job)
        try:
            done, left_by = settle(folder, disks, fate, size=size)
            held.settled = done
            if done == KEPT and size is not None:
                held.size, held.mounted = size, True
                held._record()
                log.info("%s: on the disk its last attempt kept (no copy)", folder.name)
            elif done == DROPPED and left_by is not None:
                held.dropped = (
                    f"what attempt {left_by[1]} left on its disk image here was dropped: a later attempt has run since"
                )
        except BaseException:
            held.release()
            raise
        return held

    @classmethod
    def open(cls, folder: Path, disks: Path, size: int, max_entries: int) -> JobDisk:
        """`hold` and `fill` (a warm trainer's own folder, which no job has yet)."""
        held = cls.hold(folder, disks)
        try:
            held.fill(size, max_entries)
        except BaseException:
            held.release()
            raise
        return held

    def fill(self, size: int, max_entries: int) -> None:
        """Put the folder (which exists, its owner the trainer's) on an image of `size`
        bytes. DiskError when it cannot."""
        assert self.lock is not None and not self.mounted
        image = image_of(self.folder, self.disks)
        self._record()  # before it can be left mounted
        make_image(image, size, max_entries)
        try:
            fill_image(image, self.folder, _beside(self.disks, self.folder.name, ".mnt"), size)
            mount(image, self.folder, MOUNT_OPTIONS)
        except DiskError:
            image.unlink(missing_ok=True)
            raise
        self.size, self.mounted = size, True

    def move_to(self, job: JobDisk) -> None:
        """A warm trainer's disk (`worker.pool`: opened on its own folder, which its bwrap
        shows at `/job`) becomes the disk `job` holds (its folder new): mounted on the job's
        folder too, then off the trainer's, the image renamed to the job's. DiskError when it
        cannot."""
        assert self.lock is not None and job.lock is not None and not job.mounted
        try:
            job.folder.mkdir(mode=0o700)
            job._record()
            showing = f"showing a warm trainer's disk as {job.folder}"
            run(["mount", "--bind", str(self.folder), str(job.folder)], showing)
            image_of(self.folder, self.disks).rename(image_of(job.folder, self.disks))
            unmount(self.folder)
        except (OSError, DiskError) as err:
            with contextlib.suppress(DiskError):
                if os.path.ismount(job.folder):
                    unmount(job.folder)
            raise DiskError(f"a warm trainer's disk could not become job folder {job.folder.name}'s: {err}") from err
        _beside(self.disks, self.folder.name, ".folder").unlink(missing_ok=True)
        job.size, job.mounted = self.size, True
        self.release()

    def _record(self) -> None:
        """Where the folder belongs and whose attempt it holds, beside the image
        (`bring_back_all` reads it after a worker died)."""
        job, attempt = self.job or (None, None)
        record = {"folder": str(self.folder), "job": job, "attempt": attempt}
        _beside(self.disks, self.folder.name, ".folder").write_text(json.dumps(record))

    def full(self) -> bool:
        """Whether its disk has (about) no room left: a write past it failed, or would."""
        if self.lock is None or not self.mounted or not os.path.ismount(self.folder):
            return False
        room = os.statvfs(self.folder)
        return room.f_bavail * room.f_frsize < max(FULL_BELOW, self.size // 100)

    def drop(self) -> None:
        """A warm trainer's disk that no job took: unmounted and removed, nothing brought back."""
        if self.lock is None:
            return
        try:
            if os.path.ismount(self.folder):
                unmount(self.folder)
            image_of(self.folder, self.disks).unlink(missing_ok=True)
            _beside(self.disks, self.folder.name, ".folder").unlink(missing_ok=True)
        except (DiskError, OSError):
            log.exception("could not remove the disk of %s", self.folder)
        finally:
            self.release()

    def close(self, keep: bool = False) -> str | None:
        """The attempt's processes are gone: its folder comes back onto the host's disk,
        unless `keep` (the job runs again: preempted, resized), when it stays on its image,
        mounted over the folder, for the job's next attempt here to take without a copy (the
        worker's sweep brings it back if the job ends meanwhile, `bring_back_all`).
        Once; a folder that cannot come back now stays on its image, mounted over the
        folder (the API still serves it), and comes back at the job's next attempt here or
        at the worker's next sweep: what went wrong, else None."""
        if self.lock is None:
            return None
        try:
            if self.mounted and not keep:
                bring_back(self.folder, self.disks)
            return None
        except (DiskError, OSError) as err:
            log.exception("job folder %s stays on its image for now", self.folder)
            return str(err)
        finally:
            self.release()

    def release(self) -> None:
        if self.lock is not None:
            lock, self.lock = self.lock, None
            _unlock(self.disks, self.folder.name, lock)


def disks_of(settings: Settings) -> Path:
    return settings.var_dir.resolve() / DISKS


def hold_for(folder: Path, settings: Settings, job: tuple[int, int], fate: Fate) -> JobDisk:
    """`JobDisk.hold` with the lab's settings: a kept image is taken as it is only where it
    is of `TOWERQ_JOB_FOLDER_MAX_BYTES` (the limit may have changed since)."""
    return JobDisk.hold(folder, disks_of(settings), job, fate, size=settings.job_folder_max_bytes or None)


def keeps_between_attempts(settings: Settings) -> bool:
    """Whether a job that runs again keeps its image mounted here between attempts
    (`JobDisk.close`): not on network storage, where its next attempt may run on another
    host, which must find the folder's files there."""
    return network_storage(settings.artifacts_dir) is None


def _size_for(folder: Path, settings: Settings) -> int:
    """A disk of `TOWERQ_JOB_FOLDER_MAX_BYTES` (0, no limit: the free space of the folder's
    filesystem)."""
    return settings.job_folder_max_bytes or shutil.disk_usage(folder).free


def fill_for(held: JobDisk, settings: Settings) -> None:
    """`JobDisk.fill` with the lab's settings (`_size_for`)."""
    held.fill(_size_for(held.folder, settings), JOB_FOLDER_MAX_ENTRIES)


def open_for(folder: Path, settings: Settings) -> JobDisk:
    """`JobDisk.open` with the lab's settings (`_size_for`), in `TOWERQ_VAR_DIR/disks`."""
    return JobDisk.open(folder, disks_of(settings), _size_for(folder, settings), JOB_FOLDER_MAX_ENTRIES)


def _beside(disks: Path, name: str, suffix: str) -> Path:
    """A job folder's own file in `disks`: its image (`.img`), its lock (`.lock`), where the
    folder belongs (`.folder`), where its image is mounted aside (`.mnt`)."""
    return disks / f"{name}{suffix}"


def image_of(folder: Path, disks: Path) -> Path:
    return _beside(disks, folder.name, ".img")


def _lock(disks: Path, name: str, wait: bool = True) -> int:
    """The lock of job folder `name`'s image, held (an flock, across processes); with `wait`
    False, BlockingIOError when another holds it. The file goes with the image (`_unlock`):
    one that was removed while this waited for it is not the lock any more, so the one at
    its name now is taken instead."""
    path = _beside(disks, name, ".lock")
    while True:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = os.fstat(lock)
            try:
                there = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                there = None
        except BaseException:
            os.close(lock)
            raise
        if there is not None and (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino):
            return lock
        os.close(lock)


def _unlock(disks: Path, name: str, lock: int) -> None:
    """Let go of a lock `_lock` took; its file goes too once no image of the folder is left
    (a lab's thousands of jobs would otherwise leave as many files in `disks/`)."""
    try:
        if not _beside(disks, name, ".img").exists():
            _beside(disks, name, ".lock").unlink(missing_ok=True)
    finally:
        os.close(lock)


def bring_back(folder: Path, disks: Path) -> None:
    """Copy what the image of `folder` holds back into `folder`, replacing what was there,
    and remove the image and its record (`disk_image.copy_back`); nothing when there is
    none. The caller holds the job's lock and no process of the job is left."""
    image = image_of(folder, disks)
    if not image.exists():
        return
    copy_back(image, folder, _beside(disks, folder.name, ".mnt"))
    _beside(disks, folder.name, ".folder").unlink(missing_ok=True)


def _read_record(disks: Path, name: str) -> tuple[Path, tuple[int, int] | None]:
    """Where job folder `name`'s image belongs, and whose attempt it holds (None: a warm
    trainer's slot, or a record an older worker wrote: its folder's path alone)."""
    text = _beside(disks, name, ".folder").read_text()
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        return Path(text), None
    job, attempt = record.get("job"), record.get("attempt")
    return Path(record["folder"]), (job, attempt) if isinstance(job, int) and isinstance(attempt, int) else None


def settle(
    folder: Path, disks: Path, fate: Fate | None, size: int | None = None, keep: bool = False
) -> tuple[str, tuple[int, int] | None]:
    """What an earlier attempt left on an image (kept for the job's next attempt, left by a
    worker that died or a host that rebooted), and whose attempt it was. The caller holds the
    lock. `DROPPED` where a later attempt of the job has run since (elsewhere, on storage
    several hosts share): not copied over that attempt's files. `KEPT`, left as it is, where
    the job waits to run again, the image is still mounted over the folder, and `keep` (the
    worker's sweep) or the image is of `size` (the next attempt's disk). Else `BACK`: brought
    back (`bring_back`). `NONE` when there is no image."""
    image = image_of(folder, disks)
    if not image.exists():
        if os.path.ismount(folder):  # another worker's image, whose sweep would unmount this attempt's
            raise DiskError(
                f"{folder} is a mount point, not of a disk image in {disks}: the workers of one machine "
                "must share TOWERQ_VAR_DIR"
            )
        return NONE, None
    job = _read_record(disks, folder.name)[1] if _beside(disks, folder.name, ".folder").exists() else None
    said = fate(*job) if job is not None and fate is not None else ENDED
    if said == SUPERSEDED:
        if os.path.ismount(folder):
            unmount(folder)
        image.unlink()
        _beside(disks, folder.name, ".folder").unlink(missing_ok=True)
        assert job is not None
        log.warning("job %s: the disk image attempt %s left was dropped: a later attempt has run since", *job)
        return DROPPED, job
    sized = size is not None and image.stat().st_size == max(size, MIN_IMAGE_BYTES)
    if said == WAITS and os.path.ismount(folder) and (keep or sized):
        return KEPT, job
    bring_back(folder, disks)
    return BACK, job


def bring_back_all(disks: Path, fate: Fate | None = None) -> list[str]:
    """The worker's sweep (at its start, every `SWEEP_S`, and at its stop with no `fate`):
    each image no attempt holds is settled (`settle`): those of jobs that ended come back,
    superseded ones are dropped, those kept for a job that runs again stay. What went wrong,
    one line per folder."""
    failed = []
    for image in images_in(disks):
        name = image.name.removesuffix(".img")
        try:
            lock = _lock(disks, name, wait=False)
        except BlockingIOError:
            continue
        try:
            folder, _ = _read_record(disks, name)
            settle(folder, disks, fate, keep=True)
        except Exception as err:  # the database may not answer `fate`: the image stays for later
            failed.append(f"{name}: {err}")
        finally:
            _unlock(disks, name, lock)
    return failed


def images_in(disks: Path) -> list[Path]:
    """The disk images in `disks`, by name (none where it is not there)."""
    return sorted(disks.glob("*.img")) if disks.is_dir() else []


def sweep(disks: Path, fate: Fate | None = None) -> None:
    """`bring_back_all`, each folder that could not come back said in the log."""
    for failed in bring_back_all(disks, fate):
        log.error("a job folder on its disk image could not come back: %s", failed)
