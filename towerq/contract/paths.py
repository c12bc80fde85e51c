"""Resolving user-given paths inside a root folder, refusing anything that escapes it."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath


class PathEscapeError(ValueError):
    """A user path that is absolute, climbs with `..`, or leads outside its root via a link."""


JOB_LOG_FILE = "log.txt"
"""The whole log of a job (every attempt) as its artifacts list and downloads show it."""

JOB_LOGS = "logs"
"""Where the job logs live: `<TOWERQ_ARTIFACTS_DIR>/logs/job-<id>.txt`, beside the job
folders, never inside one: a job folder is its trainer's to write, the log only towerq's."""


MODEL_FILE = "model.keras"
"""The trained model a run exports at its end (EMA weights when `ema_decay` is set)."""


BUNDLE_FILES = "files"
"""A code bundle's files, under `<TOWERQ_CODE_DIR>/<id>/` beside its manifest."""


def bundle_id(entries: list[dict[str, object]]) -> str:
    """A code bundle's id: the SHA-256 of its files' `{path, size, sha256}` sorted by path.
    The same files give the same id wherever they are packed (the client checks before it
    sends a folder again)."""
    ordered = sorted(entries, key=lambda entry: str(entry["path"]))
    return hashlib.sha256(json.dumps(ordered, sort_keys=True).encode()).hexdigest()


def bundle_root(code_dir: Path, bundle_id: str) -> Path:
    """The folder a job's code bundle is unpacked in: first on the trainer's import path."""
    return code_dir.resolve() / bundle_id / BUNDLE_FILES


def job_folder(artifacts_root: Path, job_id: int) -> Path:
    """Where one job's artifacts live: `<TOWERQ_ARTIFACTS_DIR>/job-<id>` (shared storage, so
    the worker that writes them and the API that serves them agree)."""
    return artifacts_root.resolve() / f"job-{job_id}"


def job_log(artifacts_root: Path, job_id: int) -> Path:
    """The whole log of a job, which the relay and the webhook deliverer append to; shown
    as `log.txt` among the job's artifacts. (Jobs run before it moved have theirs in their
    folder, which is read there, without following links, when this one is missing.)"""
    return artifacts_root.resolve() / JOB_LOGS / f"job-{job_id}.txt"


def check_relative(path: str) -> PurePosixPath:
    """The path as a relative POSIX path; raises when it is absolute or contains `..`."""
    if not path or "\x00" in path:
        raise PathEscapeError("must be a non-empty relative path")
    pure = PurePosixPath(path)
    if pure.is_absolute() or "\\" in path:
        raise PathEscapeError(f"{path!r} must be relative to the data folder, not absolute")
    if ".." in pure.parts:
        raise PathEscapeError(f"{path!r} must not contain '..'")
    return pure


def resolve_inside(root: Path, path: str) -> Path:
    """`root / path` with every symlink resolved; raises unless it stays inside `root`."""
    relative = check_relative(path)
    real_root = root.resolve()
    resolved = (real_root / relative).resolve()
    if resolved != real_root and real_root not in resolved.parents:
        raise PathEscapeError(f"{path!r} leads outside {root} (through a symbolic link)")
    return resolved


# -- opening files in a job folder without following what its trainer planted ------------
#
# A job folder is written by user code, so any name in it may be a symbolic link (to the
# database, a token, a `.pth` file), a FIFO (an open that never returns) or a hard link.
# Whatever towerq itself opens there goes through these: every component is opened
# relative to the folder handle above it with O_NOFOLLOW, so a link is refused wherever it
# sits, also when it is planted between a check and the open.

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFileError(PathEscapeError):
    """A name in a job folder that is a link, a FIFO, a device or a file with other names."""


def _refused(name: str, err: OSError) -> UnsafeFileError:
    if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EMLINK):
        return UnsafeFileError(f"{name!r} is a link or not a plain file: refused")
    raise err


def open_folder(root: Path | int, relative: str = "") -> int:
    """A handle on `root/relative` (close it), no component of it followed as a link;
    FileNotFoundError when it is not there, UnsafeFileError when a component is a link.
    `root` is a path or a folder handle (then left open)."""
    parts = check_relative(relative).parts if relative else ()
    try:
        fd = os.open(root, FOLDER_FLAGS) if isinstance(root, Path) else os.dup(root)
    except OSError as err:
        raise _refused(str(root), err) from err
    try:
        for part in parts:
            try:
                inner = os.open(part, FOLDER_FLAGS, dir_fd=fd)
            except OSError as err:
                raise _refused(relative, err) from err
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_plain(folder: int, name: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """`name` in the folder handle `folder`, opened with `flags` only when it is a regular
    file with no other name (a hard link could be another job's or towerq's file)."""
    try:
        fd = os.open(name, flags | FILE_FLAGS, mode, dir_fd=folder)
    except OSError as err:
        raise _refused(name, err) from err
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "a folder", name)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise UnsafeFileError(f"{name!r} is a link or not a plain file: refused")
    return fd


def open_beneath(root: Path | int, relative: str, flags: int = os.O_RDONLY) -> int:
    """The plain file `root/relative`, every component opened without following links."""
    folder, _, name = check_relative(relative).as_posix().rpartition("/")
    handle = open_folder(root, folder)
    try:
        return open_plain(handle, name, flags)
    finally:
        os.close(handle)


def append_beneath(root: Path, name: str, text: str) -> None:
    """Append `text` to the plain file `root/name` (created when missing) in one write."""
    fd = open_beneath(root, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, text.encode("utf-8", errors="replace"))
    finally:
        os.close(fd)


def replace_beneath(root: Path, name: str, text: str) -> None:
    """Write `root/name` afresh: whatever has that name now (a link, a FIFO) is removed,
    never followed, and a new file is created in its place."""
    folder = open_folder(root)
    try:
        try:
            os.unlink(name, dir_fd=folder)
        except FileNotFoundError:
            pass
        fd = open_plain(folder, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
    finally:
        os.close(folder)


def read_beneath(root: Path, name: str, limit: int) -> bytes:
    """At most `limit` bytes of the plain file `root/name`; b"" when it is missing."""
    try:
        fd = open_beneath(root, name)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as source:
        return source.read(limit)


def lines_beneath(root: Path, name: str, limit: int, max_line: int) -> Iterator[bytes]:
    """The lines of the plain file `root/name`, read a block at a time up to `limit` bytes
    in all; a line longer than `max_line` is skipped whole (never held). Nothing when the
    file is missing. The memory it takes is a block and a line, whatever the file holds."""
    try:
        fd = open_beneath(root, name)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as source:
        line, skipping, left = b"", False, limit
        while left > 0 and (block := source.read(min(LINE_BLOCK, left))):
            left -= len(block)
            *whole, rest = block.split(b"\n")
            for part in whole:
                if not skipping and len(line) + len(part) <= max_line:
                    yield line + part
                line, skipping = b"", False
            if skipping or len(line) + len(rest) > max_line:
                line, skipping = b"", True
            else:
                line += rest


LINE_BLOCK = 2**16
