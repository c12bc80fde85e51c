"""Copying a member's files without trusting them: what a job wrote (its folder on its disk
image, `worker.disk`) comes back onto the host's disk as folders, regular files and links,
never anything a name could make the copy follow, run or grant."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

COPY_CHUNK = 2**20


def copy_tree(source: Path, target: Path) -> None:
    """Copy what `source` holds (a member's files) into the empty folder `target`, which
    takes `source`'s owner and mode: folders, regular files (their holes kept, hard links
    kept as one file) and links (as links); owners, permission bits (no setuid, setgid or
    sticky bit) and times. Anything else is left out. Every name is opened relative to its
    folder's handle without following links, so a name swapped for a link on the way is
    never followed."""
    copied: dict[tuple[int, int], Path] = {}
    top = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    folders: list[tuple[Path, os.stat_result]] = [(target, os.fstat(top))]
    walking = [(top, os.scandir(top), target)]  # a folder's handle per level: as deep as the tree, not as wide
    try:
        while walking:
            here, entries, there = walking[-1]
            entry = next(entries, None)
            if entry is None:
                entries.close()
                os.close(here)
                walking.pop()
                continue
            info = entry.stat(follow_symlinks=False)
            to = there / entry.name
            if stat.S_ISDIR(info.st_mode):
                inner = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
                to.mkdir(mode=0o700)
                folders.append((to, os.fstat(inner)))
                walking.append((inner, os.scandir(inner), to))
                continue
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(entry.name, dir_fd=here), to)
            elif stat.S_ISREG(info.st_mode):
                first = copied.get((info.st_dev, info.st_ino)) if info.st_nlink > 1 else None
                if first is not None:
                    os.link(first, to)
                    continue
                copy_file(here, entry.name, to)
                copied[(info.st_dev, info.st_ino)] = to
                os.chmod(to, stat.S_IMODE(info.st_mode) & 0o777)
            else:
                continue  # FIFOs, sockets, devices
            os.chown(to, info.st_uid, info.st_gid, follow_symlinks=False)
            os.utime(to, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
    finally:
        for here, entries, _ in walking:
            entries.close()
            os.close(here)
    for folder, info in reversed(folders):  # innermost first: a folder's mode may forbid writing in it
        os.chown(folder, info.st_uid, info.st_gid)
        os.chmod(folder, stat.S_IMODE(info.st_mode) & 0o777)
        os.utime(folder, ns=(info.st_atime_ns, info.st_mtime_ns))


def copy_file(folder: int, name: str, target: Path) -> None:
    """Copy the regular file `name` of the folder handle `folder` to a new file `target`,
    leaving its holes holes."""
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
    try:
        size = os.fstat(src).st_size
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError(errno.EINVAL, f"{name} is no longer a regular file")
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            at = 0
            while at < size:
                try:
                    data = os.lseek(src, at, os.SEEK_DATA)
                except OSError as err:
                    if err.errno == errno.ENXIO:
                        break  # only a hole is left
                    raise
                hole = os.lseek(src, data, os.SEEK_HOLE)
                while data < hole:
                    chunk = os.pread(src, min(COPY_CHUNK, hole - data), data)
                    if not chunk:
                        break
                    os.pwrite(dst, chunk, data)
                    data += len(chunk)
                at = hole
            os.ftruncate(dst, size)
        finally:
            os.close(dst)
    finally:
        os.close(src)
