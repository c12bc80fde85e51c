"""An ext4 image file as a folder (`worker.disk`'s job disks): made sparse of a size, given
a copy of a folder, mounted over one (a loop device; `nosuid`, `nodev`), copied back."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from worker.sandbox import SandboxError
from worker.tree_copy import copy_tree

MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
"""`noinit_itable`: the image is a fresh sparse file, its inode tables already zeros; the
kernel's lazy initialisation would only write them out."""
BYTES_PER_INODE = 16_384
MIN_INODES = 1_024
MIN_IMAGE_BYTES = 4 * 2**20
"""mkfs.ext4's smallest useful filesystem, with room for its own metadata."""


class DiskError(SandboxError):
    """A job's folder could not be put on (or brought back from) a disk of its own."""


def run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise DiskError(f"{what}: {err}") from err
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise DiskError(f"{what}: {said[-1] if said else f'exit {done.returncode}'}")


def mount(image: Path, where: Path, options: str) -> None:
    run(["mount", "-t", "ext4", "-o", options, str(image), str(where)], f"mounting {image.name}")


def unmount(where: Path) -> None:
    """Unmount `where` (lazily when something, such as the API serving a download, still
    reads it: the loop device goes with its last reader)."""
    try:
        run(["umount", str(where)], f"unmounting {where}")
    except DiskError:
        run(["umount", "--lazy", str(where)], f"unmounting {where}")


@contextlib.contextmanager
def mounted_at(image: Path, where: Path, options: str) -> Iterator[Path]:
    """`image` mounted at the folder `where` (made for it, and removed after) for the block's
    time; a mount left there by a worker that died goes first."""
    where.mkdir(mode=0o700, exist_ok=True)
    if os.path.ismount(where):
        unmount(where)
    mount(image, where, options)
    try:
        yield where
    finally:
        unmount(where)
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
        run(command, f"making {image.name}")
    except DiskError:
        image.unlink(missing_ok=True)
        raise


def fill_image(image: Path, contents: Path, seen: Path, size: int) -> None:
    """Copy what `contents` holds into `image`, mounted at `seen` meanwhile (`copy_tree`:
    `mkfs.ext4 -d` took 1.6 times as long for a 1 GB folder; `bench/job_disk.py`).
    DiskError when it does not fit."""
    with mounted_at(image, seen, MOUNT_OPTIONS):
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


def copy_back(image: Path, folder: Path, aside: Path) -> None:
    """Copy what `image` holds into a new folder beside `folder`, which then takes its place,
    and remove the image. Read where it is mounted over the folder (an attempt's own mount,
    or one a worker that died left), then unmounted: a reader that holds a file there (the
    API serving a download) makes the unmount lazy, and the image cannot be mounted again
    meanwhile. An image alone (a host that rebooted) is mounted read only at `aside`."""
    back = folder.parent / f".{folder.name}.back"
    old = folder.parent / f".{folder.name}.old"
    shutil.rmtree(back, ignore_errors=True)
    back.mkdir(mode=0o700)
    if os.path.ismount(folder):
        copy_tree(folder, back)
        unmount(folder)
    else:
        with mounted_at(image, aside, "ro,loop,nosuid,nodev,noexec") as seen:
            copy_tree(seen, back)
    put_in_place(back, folder, old)
    image.unlink()


def put_in_place(new: Path, folder: Path, old: Path) -> None:
    """`new` takes the place of `folder` in one step (`exchange`), so a reader (the API
    listing or serving the job's files) never finds the folder missing; the folder that was
    there is removed. Where the filesystem cannot exchange, the folder moves to `old` first
    and `new` then takes its place (a moment without it)."""
    shutil.rmtree(old, ignore_errors=True)  # one a worker that died on the way left
    if folder.exists() and exchange(new, folder):
        shutil.rmtree(new, ignore_errors=True)  # the folder that was there
        return
    if folder.exists():
        folder.rename(old)
    new.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths of one filesystem atomically (Linux's `renameat2` with
    `RENAME_EXCHANGE`); False where the C library, the kernel or the filesystem cannot (NFS)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))
