"""Whether bubblewrap started an attempt's command, from bwrap's own word.

bwrap sets up the sandbox's view in its child before it runs the command, and a mount that
goes away meanwhile fails that setup ("Unable to apply mount flags", bubblewrap issue 650: a
neighbouring job's disk unmounted and its folder removed at that moment). bwrap then exits
1, as a program that failed would, and the job failed with bwrap's words for a reason
("the program exited with code 1: bwrap: Unable to apply mount flags: ..."), though
nothing of the job ever ran.

With `--json-status-fd FD` bwrap writes `{"child-pid": N}` once its child is made, and
`{"exit-code": N}` when the command ends, only if its setup finished (bwrap's
`report_child_exit_status`, since 0.3.2): no `exit-code` after an exit means the command
never ran. bwrap closes the descriptor in its child before the setup, so nothing the
command runs can write there; what is read is bwrap's alone, and at most `MOST_BYTES`.
Its one other case without `exit-code`, a command bwrap could not execute (`bwrap: execvp
...`), is the command's fault and stays a failure (a root worker's command is setpriv's,
which always executes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

MOST_BYTES = 64 * 1024
"""More than bwrap ever writes there (a line for the child's pid and namespaces, one for
its exit code)."""


class TrainerProcess(subprocess.Popen[bytes]):
    """An attempt's process; in the sandbox it reads bwrap's status (`started`)."""

    status_fd: int | None = None
    """The read end of bwrap's `--json-status-fd`, until read (`started`) or closed."""
    _said: bytes | None = None
    """What bwrap wrote there, once read."""

    def started(self) -> bool | None:
        """After its exit: whether bwrap got as far as running the command (None: not
        sandboxed). Reads what bwrap wrote, then closes the pipe."""
        if self._said is None:
            if self.status_fd is None:
                return None
            self._said = _read_all(self.status_fd)
            self.close_status()
        return any("exit-code" in _object(line) for line in self._said.splitlines())

    def close_status(self) -> None:
        if self.status_fd is not None:
            os.close(self.status_fd)
            self.status_fd = None


def _read_all(fd: int) -> bytes:
    """What the pipe holds now, at most `MOST_BYTES`: bwrap wrote it before its exit."""
    os.set_blocking(fd, False)
    chunks, size = [], 0
    try:
        while size < MOST_BYTES and (chunk := os.read(fd, MOST_BYTES - size)):
            chunks.append(chunk)
            size += len(chunk)
    except BlockingIOError:
        pass  # nothing more now
    return b"".join(chunks)


def _object(line: bytes) -> dict[str, Any]:
    try:
        said = json.loads(line)
    except ValueError:
        return {}
    return said if isinstance(said, dict) else {}


def with_status(command: list[str]) -> tuple[list[str], int | None, int | None]:
    """`command` asking bwrap for its status when it runs bwrap: (command, read end, write
    end, which the child inherits and the caller closes once it started)."""
    if not command or Path(command[0]).name != "bwrap":
        return command, None, None
    read_end, write_end = os.pipe()
    return [command[0], "--json-status-fd", str(write_end), *command[1:]], read_end, write_end


def sandbox_failed(process: subprocess.Popen[bytes], last_stderr: list[str]) -> bool:
    """The attempt's sandbox never started its command (bwrap's setup failed): the attempt
    was lost, not the job's fault."""
    if not isinstance(process, TrainerProcess) or process.returncode is None or process.returncode <= 0:
        return False
    if process.started() is not False:
        return False
    said = next((line for line in reversed(last_stderr) if line.strip()), "")
    return not said.startswith("bwrap: execvp")
