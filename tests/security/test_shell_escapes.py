"""`towerq shell` draws what a session's shell drew in the member's (or an admin's) own
terminal: a program in the session could set that terminal's clipboard (`ESC ] 52`, pasted
later into a shell of the reader's), its title, a hyperlink that says one thing and opens
another, or pass a string to the program around the terminal (tmux's DCS passthrough). What
draws passes (a shell needs colours, cursor moves, full screens); the string commands do
not, whatever the pieces the WebSocket cut them into. tests/test_shell.py checks the same
through a real session's shell."""

from __future__ import annotations

from towerq.cli.plain import TerminalOutput

DRAWS = "a\x1b[31mred\x1b[0m \x1b[2J\x1b[H\x1b(B\x1b7\x1b8\x1b[?1049h\r\n\tb\x08"
HOSTILE = [
    "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07",  # the clipboard, BEL-ended
    "\x1b]0;owned\x1b\\",  # the title, ST-ended
    "\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\",  # a hyperlink (its text stays)
    "\x1bPtmux;\x1b\x1b]52;c;eA==\x07\x1b\\",  # DCS passthrough
    "\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\",
    "\x9d52;c;eA==\x9c\x90q#0\x9c",  # the same as C1 characters
    "\x1b]0;cancelled\x18",  # CAN ends a string
]


def drawn(pieces: list[str]) -> str:
    output = TerminalOutput()
    return "".join(output.feed(piece) for piece in pieces)


def test_a_shells_string_commands_never_reach_the_terminal_in_any_pieces() -> None:
    for hostile in HOSTILE:
        text = f"{DRAWS}{hostile}{DRAWS}"
        expected = DRAWS + ("docs" if "8;;" in hostile else "") + DRAWS
        for cut in range(len(text) + 1):
            assert drawn([text[:cut], text[cut:]]) == expected, (hostile, cut)
        assert drawn(list(text)) == expected, hostile


def test_an_escape_inside_a_string_ends_it_and_is_drawn_as_a_terminal_would() -> None:
    # xterm: ESC inside OSC ends it, and the sequence it starts is read as one
    assert drawn(["\x1b]0;title\x1b[1mbold"]) == "\x1b[1mbold"
    # an unended string swallows what follows it, as in the terminal (nothing gets out)
    assert drawn(["\x1b]52;c;", "eA==", " more"]) == ""
    # other C1 controls (8-bit CSI among them) are dropped, their text kept
    assert drawn(["\x9b31mx\x85y"]) == "31mxy"


def test_the_strings_dropped_are_kept_for_towerq_shell_never_drawn() -> None:
    """The session's terminal says its shell's exit status as a string command: read, not drawn."""
    from towerq.cli.shell import exit_status

    output = TerminalOutput()
    drawn = "".join(output.feed(piece) for piece in ["logout\r\n\x1b]7777;towerq-", "exit=3\x07"])
    assert drawn == "logout\r\n" and exit_status(output.strings) == 3
    assert exit_status(TerminalOutput().strings) == 0  # a session that does not say it
