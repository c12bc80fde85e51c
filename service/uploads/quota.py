"""Quota checks that hold under parallel uploads: the check and the write that spends the
room happen under one lock per user and kind (a file lock, so every API process and
thread takes turns), so two uploads cannot each be told the whole room is theirs."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held(lock_file: Path) -> Iterator[None]:
    """Hold the quota lock `lock_file` (one user's uploads of one kind), kept where the
    user's own listings never show it."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
