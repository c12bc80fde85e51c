"""The job folder's limit: what a job writes into its folder (checkpoints, exports, its own
files) is measured every TOWERQ_JOB_FOLDER_CHECK_S while it runs (a walk of a large folder
costs the worker I/O); past TOWERQ_JOB_FOLDER_MAX_BYTES, or past
JOB_FOLDER_MAX_ENTRIES files and folders, the job is stopped at once (a checkpoint would
only write more) and fails, naming the limit.

What a walk of the folder alone would miss counts too:

- files the job's processes unlinked but hold open or mapped: their blocks stay taken on
  the disk that also holds towerq's var/ and its database until the processes end. They are
  found through `/proc/PID/fd` and `/proc/PID/map_files` of the attempt's processes (files on
  the job folder's filesystem with no name left);
- folders whose mode hides them from the worker (a worker that is not root, as the Docker
  image's, cannot read a folder of its own uid set to 000): the worker gives such a folder
  back to its owner (u+rwx, through a handle opened without following links) and reads it;
  a folder it still cannot read stops the job, as one over the limit, since it cannot be
  measured (nor served).

This is a measure, not a filesystem with a hard size. The next measure comes sooner while a
folder grows towards its limit: at half the time its growth since the last measure would
take to reach the limit, at least MIN_CHECK_S apart, so a job writing fast overshoots by
about MIN_CHECK_S of its writing, not TOWERQ_JOB_FOLDER_CHECK_S of it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MIN_CHECK_S = 1.0
"""The shortest time between two measures of a folder growing fast near its limit."""
SECOND_CHECK_S = 5.0
"""The second measure comes this soon after the first (at the start): it gives the growth."""

JOB_FOLDER_MAX_ENTRIES = 1_000_000
"""Files and folders one job folder may hold: past that, walking it (for this limit, the
artifacts list, a download) costs more than a job's outputs should."""


@dataclass
class Usage:
    bytes: int = 0
    """On disk: the blocks files take (a sparse file of a terabyte holds little)."""
    entries: int = 0
    unreadable: str | None = None
    """A folder the worker could not open, even after giving it back to its owner."""


def folder_usage(root: Path, max_entries: int) -> Usage:
    """What `root` holds, walked without following links; counting stops at `max_entries`
    entries. Nothing when there is no folder."""
    usage = Usage()
    pending = [str(root)]
    while pending and usage.entries < max_entries:
        path = pending.pop()
        try:
            scan = os.scandir(path)
        except PermissionError:
            try:
                if not _given_back(path):
                    raise
                scan = os.scandir(path)
            except OSError:
                usage.unreadable = usage.unreadable or os.path.relpath(path, root)
                continue
        except OSError:
            continue
        with scan:
            for entry in scan:
                usage.entries += 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                usage.bytes += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    pending.append(os.path.join(path, entry.name))
                if usage.entries >= max_entries:
                    break
    return usage


def _given_back(path: str) -> bool:
    """Give the owner's rights back on a folder of the worker's own uid whose mode hid it;
    False when it is not the worker's or is a link."""
    try:
        handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        info = os.fstat(handle)
        if info.st_uid != os.geteuid():
            return False
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(info.st_mode) | stat.S_IRWXU)
        return True
    except OSError:
        return False
    finally:
        os.close(handle)


def held_unlinked(pids: Iterable[int], device: int) -> int:
    """Bytes of the files on `device` with no name left that the processes `pids` hold open
    or mapped (each file once)."""
    seen: set[int] = set()
    total = 0
    for pid in pids:
        for kind in ("fd", "map_files"):
            folder = f"/proc/{pid}/{kind}"
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                try:
                    info = os.stat(f"{folder}/{name}")
                except OSError:
                    continue
                if info.st_dev != device or info.st_nlink or not stat.S_ISREG(info.st_mode) or info.st_ino in seen:
                    continue
                seen.add(info.st_ino)
                total += info.st_blocks * 512
    return total


class FolderWatch:
    """Measures one job folder at most every `every_s` seconds."""

    def __init__(self, root: Path, max_bytes: int, every_s: float) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.every_s = every_s
        self.bytes: int | None = None
        self.next_at = 0.0
        self.measured_at: float | None = None

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def measure(self, now: float, pids: Iterable[int] = ()) -> str | None:
        """Measure the folder and what the processes `pids` hold of its disk with no name
        left; the reason to stop the job when it is over a limit, else None."""
        usage = folder_usage(self.root, JOB_FOLDER_MAX_ENTRIES)
        unlinked = _held_on_folders_disk(self.root, pids)
        grew = usage.bytes + unlinked - (self.bytes or 0)
        took = now - self.measured_at if self.measured_at is not None else None
        self.bytes, self.measured_at = usage.bytes + unlinked, now
        self.next_at = now + self._next_in(grew, took)
        if usage.entries >= JOB_FOLDER_MAX_ENTRIES:
            return f"its folder holds {JOB_FOLDER_MAX_ENTRIES:,} files and folders or more (towerq's limit)"
        if usage.unreadable is not None:
            return f"its folder holds a folder towerq cannot read, so cannot measure: {usage.unreadable}"
        if self.max_bytes and self.bytes > self.max_bytes:
            held = f", {size_words(unlinked)} of it in deleted files its processes hold open" if unlinked else ""
            return (
                f"its folder takes {size_words(self.bytes)}{held}, over the {size_words(self.max_bytes)} "
                "a job folder may take (TOWERQ_JOB_FOLDER_MAX_BYTES)"
            )
        return None

    def _next_in(self, grew: int, took: float | None) -> float:
        """Seconds to the next measure: sooner while the folder grows towards its limit (it
        grew `grew` bytes in the `took` seconds since the last measure)."""
        headroom = self.max_bytes - (self.bytes or 0)
        if not self.max_bytes or headroom <= 0:
            return self.every_s
        if took is None:
            return min(self.every_s, SECOND_CHECK_S)
        if grew <= 0 or took <= 0:
            return self.every_s
        reaches_in = headroom * took / grew
        return min(self.every_s, max(MIN_CHECK_S, reaches_in / 2))


def _held_on_folders_disk(root: Path, pids: Iterable[int]) -> int:
    try:
        device = os.stat(root).st_dev
    except OSError:
        return 0
    return held_unlinked(pids, device)


def size_words(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
