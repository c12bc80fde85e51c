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


STRING_COMMANDS = frozenset("]PX^_")
"""After ESC: the string commands OSC, DCS, SOS, PM and APC."""
C1_STRING_COMMANDS = frozenset("\x90\x98\x9d\x9e\x9f")
"""The same as one C1 character each."""
STRING_ENDS = frozenset("\x07\x9c\x18\x1a")
"""BEL, ST, and the CAN and SUB that cancel a string; ESC \\ (ST) as well."""
NOTHING_TO_DROP = re.compile(r"[^\x1b\x80-\x9f]*")
C1_AS_ESC = {"\x90": "P", "\x98": "X", "\x9d": "]", "\x9e": "^", "\x9f": "_"}
STRING_KEPT = 256
STRINGS_KEPT = 8


class TerminalOutput:
    """A remote terminal's output as it may reach this one (`towerq shell`): what draws
    passes (text, colours, cursor moves, the screens of full-screen programs such as top and
    vim: C0 controls, ESC and CSI sequences); the string commands (OSC, DCS, SOS, PM, APC:
    the clipboard, the window title, hyperlinks, passthrough to the terminal's host) and
    other C1 controls are dropped. Fed in pieces: a sequence cut between two is seen whole."""

    def __init__(self) -> None:
        self.state = "text"  # or "esc" (after ESC), "string" (inside one), "string-esc"
        self.strings: list[str] = []
        """The last string commands dropped (their first `STRING_KEPT` characters): what the
        caller may read of them, never drawn (`towerq shell`'s exit status)."""
        self._string = ""

    def feed(self, text: str) -> str:
        if self.state == "text" and NOTHING_TO_DROP.fullmatch(text):
            return text
        kept: list[str] = []
        for char in text:
            self._one(char, kept)
        return "".join(kept)

    def _one(self, char: str, kept: list[str]) -> None:
        if self.state == "string":
            if char == "\x1b":
                self.state = "string-esc"
            elif char in STRING_ENDS:
                self._ended()
            elif len(self._string) < STRING_KEPT:
                self._string += char
            return
        if self.state == "string-esc":  # ESC \ ends it; ESC and another starts that one (xterm)
            self._ended()
            if char == "\\":
                return
            self.state = "esc"
        if self.state == "esc":
            self.state = "text"
            if char in STRING_COMMANDS:
                self.state, self._string = "string", char
                return
            if char == "\x1b":  # ESC ESC: the second starts the sequence
                self.state = "esc"
                return
            if char == "\\":  # an ST with no string to end does nothing
                return
            if " " <= char <= "~":
                kept.append("\x1b" + char)
                return
            kept.append("\x1b")
        if char == "\x1b":
            self.state = "esc"
        elif "\x80" <= char <= "\x9f":
            self.state = "string" if char in C1_STRING_COMMANDS else "text"
            self._string = C1_AS_ESC.get(char, "")
        else:
            kept.append(char)

    def _ended(self) -> None:
        self.state = "text"
        self.strings = [*self.strings[-(STRINGS_KEPT - 1) :], self._string]
