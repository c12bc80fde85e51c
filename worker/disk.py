"""A job's writable space with a hard size (`TOWERQ_JOB_DISK`: `auto`, `image`, `measure`).

The measure of `worker.folder` stops a job past `TOWERQ_JOB_FOLDER_MAX_BYTES`, about a
second of its writing late. With an image the job's folder is, while an attempt runs, an
ext4 filesystem of exactly that size of its own: a sparse file under
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
once the folder is back, so a worker that dies on the way (or a host that reboots) brings
it back at its next start (`bring_back_all`) or at the job's next attempt.

One attempt of a job holds its image at a time (an flock beside it, across processes): the
next attempt of the same job on this machine waits until the last one's folder is back.

Not the default (`measure` is) while two things are unsafe: the worker writes into a job's
folder (its spec) before it takes the job's lock, so a second worker sharing `var/` that
brings a dead worker's image back at that moment loses the write (a chaos run lost a spec
file so); and where the artifacts folder is storage shared by several hosts, an image a
dead host brings back later would replace what a newer attempt elsewhere wrote, and an API
on another host does not see a running job's folder.

Needs a root worker (loop devices, mounts) and `mkfs.ext4`. `auto` uses images where that
works and the measure elsewhere (a worker that is not root, a container
without loop devices), and says which in the worker's log; a worker set to `image` where
it cannot work refuses to start and says why (`images_work`). A job over several hosts
keeps the measure: its ranks share one folder on the lab's storage. A warm trainer
(`worker.pool`) is started before its job is known, on a disk of its own (its folder,
shown at `/job`); the job that takes it takes the disk (`JobDisk.move_to`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from service.core.settings import Settings
from worker.folder import JOB_FOLDER_MAX_ENTRIES
from worker.sandbox import SandboxError
from worker.tree_copy import copy_tree

log = logging.getLogger(__name__)

DISK_KINDS = ("auto", "image", "measure")
DISKS = "disks"
"""The images' folder, in `TOWERQ_VAR_DIR`."""
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
"""`noinit_itable`: the image is a fresh sparse file, its inode tables already zeros; the
kernel's lazy initialisation would only write them out."""
BYTES_PER_INODE = 16_384
MIN_INODES = 1_024
MIN_IMAGE_BYTES = 4 * 2**20
"""mkfs.ext4's smallest useful filesystem, with room for its own metadata."""
FULL_BELOW = 2**20
"""A disk with less room than this (or 1 % of its size) is full: ext4 keeps its last blocks
for its own metadata, so a disk a job filled rarely shows 0."""


class DiskError(SandboxError):
    """A job's folder could not be put on (or brought back from) a disk of its own."""


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DiskError(f"{what}: {err}") from err
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise DiskError(f"{what}: {said[-1] if said else f'exit {done.returncode}'}")


def _mount(image: Path, where: Path, options: str) -> None:
    _run(["mount", "-t", "ext4", "-o", options, str(image), str(where)], f"mounting {image.name}")


def _unmount(where: Path) -> None:
    """Unmount `where` (lazily when something, such as the API serving a download, still
    reads it: the loop device goes with its last reader)."""
    try:
        _run(["umount", str(where)], f"unmounting {where}")
    except DiskError:
        _run(["umount", "--lazy", str(where)], f"unmounting {where}")


@contextlib.contextmanager
def _mounted(image: Path, where: Path, options: str) -> Iterator[Path]:
    """`image` mounted at the folder `where` (made for it, and removed after) for the block's
    time; a mount left there by a worker that died goes first."""
    where.mkdir(mode=0o700, exist_ok=True)
    if os.path.ismount(where):
        _unmount(where)
    _mount(image, where, options)
    try:
        yield where
    finally:
        _unmount(where)
        where.rmdir()


def inodes_for(size: int, max_entries: int) -> int:
    return max(MIN_INODES, min(max_entries, size // BYTES_PER_INODE))


def make_image(image: Path, size: int, max_entries: int) -> None:
    """An empty sparse ext4 image of `size` bytes."""
    with open(image, "wb") as made:
        made.truncate(max(size, MIN_IMAGE_BYTES))
    command = ["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal", "-m", "0"]
    command += ["-N", str(inodes_for(size, max_entries))]  # 4 KiB blocks: a small one's 1 KiB caps a file at 16 GiB
    command += ["-E", "lazy_itable_init=1,nodiscard", str(image)]
    try:
        _run(command, f"making {image.name}")
    except DiskError:
        image.unlink(missing_ok=True)
        raise


def fill_image(image: Path, contents: Path, seen: Path, size: int) -> None:
    """Copy what `contents` holds into `image`, mounted at `seen` meanwhile (`copy_tree`:
    `mkfs.ext4 -d` took 1.6 times as long for a 1 GB folder; `bench/job_disk.py`).
    DiskError when it does not fit."""
    with _mounted(image, seen, MOUNT_OPTIONS):
        try:
            with contextlib.suppress(OSError):
                (seen / "lost+found").rmdir()  # ext4's own: not the job's
            copy_tree(contents, seen)
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskError(
                    f"its folder does not fit a disk of {size:,} bytes (TOWERQ_JOB_FOLDER_MAX_BYTES)"
                ) from err
            raise DiskError(f"copying its folder onto its disk: {err}") from err


@functools.cache
def images_work(var_dir: Path) -> str | None:
    """None when this worker can put a job's folder on an image of its own, else why not."""
    if os.geteuid() != 0:
        return "it needs a worker that is root (loop devices and mounts)"
    if shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 is not installed (apt install e2fsprogs)"
    var_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=var_dir, prefix=".disk-probe-") as name:
        probe = Path(name)
        try:
            make_image(probe / "probe.img", MIN_IMAGE_BYTES, MIN_INODES)
            with _mounted(probe / "probe.img", probe / "mounted", MOUNT_OPTIONS):
                pass
        except DiskError as err:
            return f"a loop-mounted image does not work here ({err})"
    return None


def check(kind: str, var_dir: Path) -> None:
    """DiskError when `TOWERQ_JOB_DISK` is `kind` and this worker cannot do it (it refuses
    to start, as for a missing sandbox)."""
    if kind not in DISK_KINDS:
        raise DiskError(f"TOWERQ_JOB_DISK is {kind!r}: use {', '.join(DISK_KINDS)}")
    if kind == "image" and (why := images_work(var_dir.resolve())) is not None:
        raise DiskError(f"TOWERQ_JOB_DISK=image: {why}; or set TOWERQ_JOB_DISK=measure")


def in_use(settings: Settings) -> bool:
    """Whether this worker puts job folders on images: `image` (checked at its start),
    `auto` where it can (a root worker that mounts a loop image), never with `measure`."""
    if settings.job_disk == "measure":
        return False
    return settings.job_disk == "image" or images_work(settings.var_dir.resolve()) is None


def described(settings: Settings) -> str:
    """What holds a job folder's limit on this worker, in words for its log."""
    if in_use(settings):
        return "job folders are disk images of TOWERQ_JOB_FOLDER_MAX_BYTES while attempts run (TOWERQ_JOB_DISK)"
    why = "" if settings.job_disk == "measure" else f": {images_work(settings.var_dir.resolve())}"
    return f"job folders are measured, not disk images (TOWERQ_JOB_DISK={settings.job_disk}{why})"


class JobDisk:
    """One attempt's hold on its job's image (`open`, then `close` once its processes are gone)."""

    def __init__(self, folder: Path, disks: Path, lock: int, size: int) -> None:
        self.folder = folder
        self.disks = disks
        self.lock: int | None = lock
        self.size = size

    @classmethod
    def open(cls, folder: Path, disks: Path, size: int, max_entries: int) -> JobDisk:
        """Put `folder` (which exists, its owner the trainer's) on an image of `size` bytes.
        Waits while another attempt of the job holds it. DiskError when it cannot."""
        disks.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = _lock(disks, folder.name)
        try:
            bring_back(folder, disks)  # an earlier attempt's, left by a worker that died
            image = image_of(folder, disks)
            _beside(disks, folder.name, ".folder").write_text(str(folder))  # before it can be left mounted
            make_image(image, size, max_entries)
            try:
                fill_image(image, folder, _beside(disks, folder.name, ".mnt"), size)
                _mount(image, folder, MOUNT_OPTIONS)
            except DiskError:
                image.unlink(missing_ok=True)
                raise
        except BaseException:
            os.close(lock)
            raise
        return cls(folder, disks, lock, size)

    def move_to(self, folder: Path) -> None:
        """A warm trainer's disk (`worker.pool`: opened on its own folder, which its bwrap
        shows at `/job`) becomes its job's: mounted on the job's new `folder` too, then off
        the trainer's, the image renamed to the job's. DiskError when it cannot."""
        assert self.lock is not None
        why = f"a warm trainer's disk could not become job folder {folder.name}'s"
        try:
            lock = _lock(self.disks, folder.name, wait=False)  # the job's folder is new: no attempt holds it
        except OSError as err:
            raise DiskError(f"{why}: {err}") from err
        try:
            folder.mkdir(mode=0o700)
            _beside(self.disks, folder.name, ".folder").write_text(str(folder))
            _run(["mount", "--bind", str(self.folder), str(folder)], f"showing a warm trainer's disk as {folder}")
            image_of(self.folder, self.disks).rename(image_of(folder, self.disks))
            _unmount(self.folder)
            for suffix in (".folder", ".lock"):  # a slot's name is used once
                _beside(self.disks, self.folder.name, suffix).unlink(missing_ok=True)
        except (OSError, DiskError) as err:
            os.close(lock)
            raise DiskError(f"{why}: {err}") from err
        os.close(self.lock)
        self.lock, self.folder = lock, folder

    def full(self) -> bool:
        """Whether its disk has (about) no room left: a write past it failed, or would."""
        if self.lock is None or not os.path.ismount(self.folder):
            return False
        room = os.statvfs(self.folder)
        return room.f_bavail * room.f_frsize < max(FULL_BELOW, self.size // 100)

    def drop(self) -> None:
        """A warm trainer's disk that no job took: unmounted and removed, nothing brought back."""
        if self.lock is None:
            return
        try:
            if os.path.ismount(self.folder):
                _unmount(self.folder)
            image_of(self.folder, self.disks).unlink(missing_ok=True)
            for suffix in (".folder", ".lock"):  # a slot's name is used once
                _beside(self.disks, self.folder.name, suffix).unlink(missing_ok=True)
        except (DiskError, OSError):
            log.exception("could not remove the disk of %s", self.folder)
        finally:
            os.close(self.lock)
            self.lock = None

    def close(self) -> str | None:
        """The attempt's processes are gone: its folder comes back onto the host's disk.
        Once; a folder that cannot come back now stays on its image, mounted over the
        folder (the API still serves it), and comes back at the job's next attempt here or
        at the worker's next start: what went wrong, else None."""
        if self.lock is None:
            return None
        try:
            bring_back(self.folder, self.disks)
            return None
        except (DiskError, OSError) as err:
            log.exception("job folder %s stays on its image for now", self.folder)
            return str(err)
        finally:
            os.close(self.lock)
            self.lock = None


def open_for(folder: Path, settings: Settings) -> JobDisk:
    """`JobDisk.open` with the lab's settings: a disk of `TOWERQ_JOB_FOLDER_MAX_BYTES` (0, no
    limit: the free space of the folder's filesystem) in `TOWERQ_VAR_DIR/disks`."""
    size = settings.job_folder_max_bytes or shutil.disk_usage(folder).free
    return JobDisk.open(folder, settings.var_dir.resolve() / DISKS, size, JOB_FOLDER_MAX_ENTRIES)


def _beside(disks: Path, name: str, suffix: str) -> Path:
    """A job folder's own file in `disks`: its image (`.img`), its lock (`.lock`), where the
    folder belongs (`.folder`), where its image is mounted aside (`.mnt`)."""
    return disks / f"{name}{suffix}"


def image_of(folder: Path, disks: Path) -> Path:
    return _beside(disks, folder.name, ".img")


def _lock(disks: Path, name: str, wait: bool = True) -> int:
    """The lock of job folder `name`'s image, held (an flock, across processes); with `wait`
    False, BlockingIOError when another holds it."""
    lock = os.open(_beside(disks, name, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(lock)
        raise
    return lock


def bring_back(folder: Path, disks: Path) -> None:
    """Copy what the image of `folder` holds back into `folder`, replacing what was there,
    and remove the image; nothing when there is none. The caller holds the job's lock and
    no process of the job is left. Read where it is mounted over the folder (the attempt's
    own mount, or one a worker that died left), then unmounted: a reader that holds a file
    there (the API serving a download) makes the unmount lazy, and the image cannot be
    mounted again meanwhile. An image alone (a host that rebooted) is mounted read only."""
    image = image_of(folder, disks)
    if not image.exists():
        return
    back = folder.parent / f".{folder.name}.back"
    old = folder.parent / f".{folder.name}.old"
    shutil.rmtree(back, ignore_errors=True)
    back.mkdir(mode=0o700)
    if os.path.ismount(folder):
        copy_tree(folder, back)
        _unmount(folder)
    else:
        with _mounted(image, _beside(disks, folder.name, ".mnt"), "ro,loop,nosuid,nodev,noexec") as seen:
            copy_tree(seen, back)
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    back.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    image.unlink()
    _beside(disks, folder.name, ".folder").unlink(missing_ok=True)


def bring_back_all(disks: Path) -> list[str]:
    """At a worker's start: the folders left on their images (a worker that died, a host
    that rebooted) come back, but for those another worker's attempt holds. What went
    wrong, one line per folder."""
    failed = []
    for image in sorted(disks.glob("*.img")) if disks.is_dir() else []:
        name = image.name.removesuffix(".img")
        try:
            lock = _lock(disks, name, wait=False)
        except BlockingIOError:
            continue
        try:
            bring_back(Path(_beside(disks, name, ".folder").read_text()), disks)
        except (DiskError, OSError) as err:
            failed.append(f"{name}: {err}")
        finally:
            os.close(lock)
    return failed
