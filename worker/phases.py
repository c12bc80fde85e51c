"""How long each phase of something took: an attempt's end, a worker's shutdown (said in
the worker's log where one is slow)."""

from __future__ import annotations

import time


class Phases:
    """How long each phase of something took, in seconds since the last mark."""

    def __init__(self, since: float | None = None) -> None:
        self.last = time.monotonic() if since is None else since
        self.spent: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.spent.append((name, now - self.last))
        self.last = now

    def total(self) -> float:
        return sum(seconds for _, seconds in self.spent)

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.spent)
