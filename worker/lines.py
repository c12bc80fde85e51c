"""A process's output cut into lines as a person reads them in a terminal: a line ends at a
newline (`\\r\\n` is one), and a carriage return alone redraws the line instead of ending
it: a progress bar (tqdm, Keras' progress bar, pip's download bar) writes `\\r` and the bar
again, up to ten times a second, and ends with a newline. Read as lines, a bar was one line
of every redraw side by side, said only once it ended (an epoch later).

`LineReader` says each line once, as it ended (a bar: its last drawing), and while a line
is being redrawn, its latest drawing at most every `every_s`: a long epoch's bar shows how
far it got, not thousands of lines. `pieces` is the cut alone (worker.gang marks each
piece of a rank's output with its rank).

Standard library only: worker.gang runs it in the sandbox before any user code."""

from __future__ import annotations

import re

LINE_ENDS = re.compile(rb"(\r\n|\n|\r)")
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?")
"""Terminal escape sequences: CSI (colours `ESC[32m`, cursor moves `ESC[2K`), OSC (a window
title, `ESC]0;…BEL`) and the short ones; a lone ESC too."""


def without_escapes(text: str) -> str:
    """A line as text, without the terminal's escape sequences: a program that colours its
    log (loguru, rich or colorlog told to, `FORCE_COLOR`) reads in the log as it would on a
    terminal without colours, not with `[32m` in it."""
    return ESCAPES.sub("", text) if "\x1b" in text else text


def pieces(data: bytes) -> tuple[list[bytes], bytes]:
    """`data` cut after each line end (`\\n`, `\\r\\n`) and each redraw (a lone `\\r`), each
    piece with its end, and what follows the last one. A `\\r` at the very end stays in what
    follows: the `\\n` of a `\\r\\n` may come in the next read."""
    parts = LINE_ENDS.split(data)
    rest = parts.pop()
    cut = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    if not rest and cut and cut[-1].endswith(b"\r") and not cut[-1].endswith(b"\r\n"):
        rest = cut.pop()
    return cut, rest


class LineReader:
    """One stream's lines as its reads come (`feed`), at each tick (`tick`) and at its end
    (`close`). A line longer than `max_line` bytes comes cut to that length (a caller can
    tell by its length), and the rest of it, up to its end, is dropped: what a process
    writes without a line end never piles up here."""

    def __init__(self, max_line: int, every_s: float) -> None:
        self.max_line = max_line
        self.every_s = every_s
        self.rest = b""
        self.dropping = False
        """Within a line already cut at `max_line`: the rest of it up to its end is dropped."""
        self.drawn: bytes | None = None
        """The line's latest whole drawing, while it is being redrawn."""
        self.redrawn_at: float | None = None
        """When the line was first redrawn (None: it is not being redrawn)."""
        self.said: bytes | None = None
        """The drawing of this line said last, and when."""
        self.said_at = 0.0

    def feed(self, chunk: bytes, now: float) -> list[bytes]:
        cut, rest = pieces(self.rest + chunk)
        lines = []
        for piece in cut:
            text = piece.rstrip(b"\r\n")
            ends_line = piece[len(text) :] != b"\r"
            if self.dropping:
                self.dropping = False  # the end of a piece already cut
                if ends_line:
                    self._new_line()
                continue
            text = text[: self.max_line]
            if not ends_line:
                if text.strip():
                    self.drawn = text
                if self.redrawn_at is None:
                    self.redrawn_at = now
                continue
            if not text.strip() and self.drawn is not None:
                text = self.drawn  # ended right after its last drawing (`bar\r\n`, `\rbar\r` then `\n`)
            if text != self.said:
                lines.append(text)
            self._new_line()
        self.rest = b"" if self.dropping else rest
        if len(self.rest) > self.max_line:
            lines.append(self.rest[: self.max_line])
            self.rest, self.dropping = b"", True
        return lines + self.tick(now)

    def tick(self, now: float) -> list[bytes]:
        """The line being redrawn as it stands, where it changed and `every_s` have passed
        since it was first redrawn or said last."""
        if self.redrawn_at is None:
            return []
        standing = self.rest.rstrip(b"\r")
        view = standing if standing.strip() and not self.dropping else self.drawn
        if view is None or view == self.said or now - max(self.redrawn_at, self.said_at) < self.every_s:
            return []
        self.said, self.said_at = view, now
        return [view]

    def close(self) -> list[bytes]:
        """The stream ended: its last line, though it had no end."""
        standing = b"" if self.dropping else self.rest.rstrip(b"\r")
        last = standing if standing.strip() else self.drawn
        said = self.said
        self.rest, self.dropping = b"", False
        self._new_line()
        return [last] if last and last != said else []

    def _new_line(self) -> None:
        self.drawn = self.redrawn_at = self.said = None
