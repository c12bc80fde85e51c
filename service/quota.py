"""Quota checks that hold under parallel uploads: the check and the write that spends the
room happen under one lock per user and kind (a file lock, so every API process and
thread takes turns), so two uploads cannot each be told the whole room is theirs."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".quota.lock"


@contextmanager
def held(folder: Path) -> Iterator[None]:
    """Hold the quota lock of `folder` (one user's uploads of one kind)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
