"""A job's artifacts as the API serves them: listing, one file, a folder as a .tar.gz stream.

Artifacts live in `TOWERQ_ARTIFACTS_DIR/job-<id>/` on storage the workers and the API share.
Every path a caller names is confined to that folder (no absolute paths, no `..`, no links
leading out), as for datasets. The folder is written by the job's own code, so nothing in it
is followed as a link: every file is opened component by component with O_NOFOLLOW
(`towerq.contract.paths.open_beneath`), which also closes the race between a check and the
open, and links, FIFOs and hard-linked files are left out of listings and archives.
"""

from __future__ import annotations

import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.core.exceptions import NotFoundError, SpecError
from towerq.contract.paths import JOB_LOG_FILE, PathEscapeError, check_relative, open_beneath, open_folder

LIST_LIMIT = 10_000
CHUNK_BYTES = 256 * 1024


def _files(root: int) -> list[tuple[str, os.stat_result]]:
    """(relative path, stat) of the plain files under the folder handle `root`, sorted by
    path; links (to files or folders), FIFOs, devices and hard-linked files are left out,
    never followed."""
    found = []
    try:
        for folder, _, names, folder_fd in os.fwalk(".", follow_symlinks=False, dir_fd=root):
            relative = Path(folder)
            for name in names:
                try:
                    info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                    found.append(((relative / name).as_posix(), info))
    except OSError:
        pass  # the folder went away, or its top is not a folder
    return sorted(found)


def _log_stat(log: Path) -> os.stat_result | None:
    try:
        info = os.stat(log, follow_symlinks=False)
    except OSError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def _with_log(files: list[tuple[str, os.stat_result]], log: Path) -> list[tuple[str, os.stat_result]]:
    """The folder's files with the job log as `log.txt` (a `log.txt` the job wrote itself
    gives way to it); a job run before the log moved keeps the one in its folder."""
    info = _log_stat(log)
    if info is None:
        return files
    return sorted([entry for entry in files if entry[0] != JOB_LOG_FILE] + [(JOB_LOG_FILE, info)])


def open_log(root: Path, log: Path) -> int | None:
    """A read handle on the job's whole log (close it): the job log, or for a job run
    before it moved the `log.txt` in its folder; None when there is neither (or the old
    one is a link or no plain file)."""
    for folder, name in ((log.parent, log.name), (root, JOB_LOG_FILE)):
        try:
            return open_beneath(folder, name)
        except (OSError, PathEscapeError):
            continue
    return None


def list_artifacts(root: Path, log: Path) -> dict[str, Any]:
    """Files under the job's folder, and its log: path (relative), size, modified (UTC)."""
    items: list[dict[str, Any]] = []
    total = 0
    truncated = False
    try:
        handle = open_folder(root)
    except (OSError, PathEscapeError):
        files = []
    else:
        try:
            files = _files(handle)
        finally:
            os.close(handle)
    for path, info in _with_log(files, log):
        if len(items) >= LIST_LIMIT:
            truncated = True
            break
        total += info.st_size
        items.append({"path": path, "size": info.st_size, "modified": datetime.fromtimestamp(info.st_mtime, UTC)})
    return {"items": items, "total_bytes": total, "truncated": truncated}


def open_artifact(root: Path, path: str, log: Path) -> int | None:
    """A read handle on the plain file `path` inside the job's folder, or on its log for
    `log.txt` (close it); None when `path` is a folder there."""
    if path == JOB_LOG_FILE and _log_stat(log) is not None:
        return open_beneath(log.parent, log.name)
    try:
        check_relative(path)
        return open_beneath(root, path)
    except FileNotFoundError as err:
        raise NotFoundError(f"no artifact {path!r}") from err
    except NotADirectoryError as err:
        raise NotFoundError(f"no artifact {path!r}") from err
    except IsADirectoryError:
        return None
    except PathEscapeError as err:
        raise SpecError(
            "path", f"{path!r} is not a plain file inside the job's artifacts (absolute, '..', or a link)"
        ) from err


def tar_gz_stream(root: Path, relative: str, top: str, log: Path) -> Iterator[bytes]:
    """The folder `relative` of the job folder `root` (the whole folder: with the job's log
    as `log.txt`) as a .tar.gz, produced by a thread into a pipe while it is sent, so a
    large folder never sits in memory; stopping the iteration (the client left) stops the
    thread. NotFoundError when it is no folder (or a link)."""
    try:
        folder = open_folder(root, relative)
    except (OSError, PathEscapeError) as err:
        raise NotFoundError(f"no folder {relative or root.name!r} in the job's artifacts") from err
    return _stream(folder, top, None if relative else log)


def is_tensorboard_file(path: str) -> bool:
    """A file TensorBoard reads: an event file (`tfevents` in its name, as TensorBoard
    itself tells them) or a plugin's file beside one (the profiler's `plugins/profile/`)."""
    parts = path.split("/")
    return "tfevents" in parts[-1] or "plugins" in parts[:-1]


def tensorboard_stream(root: Path, job_id: int) -> Iterator[bytes]:
    """Every TensorBoard file of the job's folder, wherever it wrote them (towerq's trainer
    in `tensorboard/`; a program in `work/runs/`, `work/lightning_logs/`, `output/`), in
    their folders, as a .tar.gz (`job-<id>/`). NotFoundError when there is none."""
    try:
        folder = open_folder(root)
    except (OSError, PathEscapeError) as err:
        raise NotFoundError(f"job {job_id} has no artifacts yet") from err
    files = [entry for entry in _files(folder) if is_tensorboard_file(entry[0])]
    if not files:
        os.close(folder)
        raise NotFoundError(f"job {job_id} wrote no TensorBoard events (files named *tfevents*) in its folder")
    return _stream(folder, f"job-{job_id}", None, files)


def _stream(
    folder: int, top: str, log: Path | None, chosen: list[tuple[str, os.stat_result]] | None = None
) -> Iterator[bytes]:
    """The folder handle `folder`'s files (`chosen` of them, where given; with the job's
    `log`) as a .tar.gz under `top/`; the handle is closed once done."""
    read_fd, write_fd = os.pipe()

    def produce() -> None:
        try:
            with os.fdopen(write_fd, "wb") as sink, tarfile.open(fileobj=sink, mode="w|gz") as archive:
                files = _files(folder) if chosen is None else chosen
                for path, _ in _with_log(files, log) if log is not None else files:
                    try:
                        where = (log.parent, log.name) if log is not None and path == JOB_LOG_FILE else (folder, path)
                        source = os.fdopen(open_beneath(*where), "rb")
                    except (OSError, PathEscapeError):
                        continue  # gone, or swapped for a link since the listing
                    with source:
                        info = archive.gettarinfo(arcname=f"{top}/{path}", fileobj=source)
                        archive.addfile(info, source)
        except OSError:  # the reader went away (broken pipe), or a file vanished mid-read
            pass
        finally:
            os.close(folder)

    producer = threading.Thread(target=produce, name=f"tar {top}", daemon=True)
    producer.start()
    with os.fdopen(read_fd, "rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            yield chunk
    producer.join()
