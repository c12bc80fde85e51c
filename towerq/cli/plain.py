"""What the terminal is sent: plain text. A job's name, error, log lines and every other
word a member or a trainer wrote reach other members' terminals through `towerq jobs`,
`show` and `logs`; an escape sequence among them could set the clipboard (`ESC ] 52`),
the window title, or clear and redraw the screen. So the CLI's stdout and stderr drop
every control character but newline and tab (`install`); the CLI's own live lines go
around that filter (`rewrite_line`), with the user's words in them filtered all the same."""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab and newline, DEL, and C1 controls (ESC, CSI, OSC, BEL, CR, ...)."""
CLEAR_TO_END = "\x1b[K"


def plain(text: str) -> str:
    """`text` without terminal control characters."""
    return CONTROL.sub("", text)


class PlainStream:
    """A text stream that writes `plain` text to the stream it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self.raw = stream

    def write(self, text: str) -> int:
        self.raw.write(plain(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def install() -> None:
    """Make the process's stdout and stderr plain (once)."""
    if not isinstance(sys.stdout, PlainStream):
        sys.stdout = PlainStream(sys.stdout)
    if not isinstance(sys.stderr, PlainStream):
        sys.stderr = PlainStream(sys.stderr)


def rewrite_line(text: str, stream: TextIO | None = None, clear: bool = True) -> None:
    """Draw `text` (made plain) over the terminal's current line: a live progress line."""
    out = stream or sys.stdout
    raw = out.raw if isinstance(out, PlainStream) else out
    raw.write("\r" + plain(text) + (CLEAR_TO_END if clear else ""))
    raw.flush()
