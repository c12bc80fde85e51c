"""The job folder's limit: what a job writes into its folder (checkpoints, exports, its own
files) is measured every TOWERQ_JOB_FOLDER_CHECK_S while it runs (a walk of a large folder
costs the worker I/O); past TOWERQ_JOB_FOLDER_MAX_BYTES, or past
JOB_FOLDER_MAX_ENTRIES files and folders, the job is stopped at once (a checkpoint would
only write more) and fails, naming the limit."""

from __future__ import annotations

from pathlib import Path

from towerq.contract.paths import folder_usage

JOB_FOLDER_MAX_ENTRIES = 1_000_000
"""Files and folders one job folder may hold: past that, walking it (for this limit, the
artifacts list, a download) costs more than a job's outputs should."""


class FolderWatch:
    """Measures one job folder at most every `every_s` seconds."""

    def __init__(self, root: Path, max_bytes: int, every_s: float) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.every_s = every_s
        self.bytes: int | None = None
        self.next_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def measure(self, now: float) -> str | None:
        """Measure the folder; the reason to stop the job when it is over a limit, else None."""
        self.next_at = now + self.every_s
        self.bytes, entries = folder_usage(self.root, JOB_FOLDER_MAX_ENTRIES)
        if entries >= JOB_FOLDER_MAX_ENTRIES:
            return f"its folder holds {JOB_FOLDER_MAX_ENTRIES:,} files and folders or more (towerq's limit)"
        if self.max_bytes and self.bytes > self.max_bytes:
            return (
                f"its folder takes {size_words(self.bytes)}, over the {size_words(self.max_bytes)} "
                "a job folder may take (TOWERQ_JOB_FOLDER_MAX_BYTES)"
            )
        return None


def size_words(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
