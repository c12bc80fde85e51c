"""A member's program's environment, given past the sandbox's root processes.

bwrap and setpriv run as root and pass their environment on, so a command job's or a
notebook session's `env` (the member's to set) would reach them, and what glibc and the
tools read of the environment as they start and run (its loader, `setlocale`, messages)
would be the member's to set, as root. So they start with none: the program's environment
is written to an unnamed file (`environment_file`) given as the process's stdin, and the
sandbox's first step after the drop to the program's user (`ENVIRONMENT_STEP`, put before
the program by `worker.launch.in_sandbox(..., environment_on_stdin=True)`) reads it, then
runs the program with /dev/null for stdin. `worker.launch.start_trainer(..., program_env=)`
gives the file. Either half without the other fails, never starting a program with an
empty environment: the step wants the file's last line (`ENVIRONMENT_END`), and
`start_trainer` refuses an environment for a command that does not run the step
(`reads_environment`). (dash refuses descriptor numbers over 9, hence stdin rather than an
inherited descriptor.)"""

from __future__ import annotations

import os
import re
import shlex

from worker.sandbox import SandboxError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A name sh can export."""
ENVIRONMENT_END = ": the end of the environment from towerq"
"""The last line of every `environment_file`: ENVIRONMENT_STEP runs nothing without it."""
ENVIRONMENT_STEP = [
    "/bin/sh", "-c",
    'exports=$(/bin/cat) || exit 127; '
    f'case $exports in *"{ENVIRONMENT_END}") ;; '
    '*) echo "towerq: the program\'s environment did not come on stdin (a fault of towerq\'s)" >&2; exit 127;; esac; '
    'eval "$exports" || exit 127; exec "$@" </dev/null',
    "towerq",
]  # fmt: skip
"""What starts a member's program inside the sandbox, after the drop to its user: its
environment, read from stdin (`environment_file`), then the program, with /dev/null for
stdin. Where its stdin is not such a file (ending with ENVIRONMENT_END), it runs nothing and
says so."""


def environment_file(env: dict[str, str]) -> int:
    """A descriptor of an unnamed file (a memfd), at its start, that ENVIRONMENT_STEP reads
    `env` from: an `export NAME='value'` line for each, quoted for sh. The caller closes it
    once the process started."""
    lines = []
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            raise SandboxError(f"not an environment variable's name: {name!r}")
        lines.append(f"export {name}={shlex.quote(value)}\n")
    lines.append(ENVIRONMENT_END + "\n")
    fd = os.memfd_create("towerq-environment", os.MFD_CLOEXEC)
    with open(fd, "wb", closefd=False) as file:  # a file object writes it all
        file.write("".join(lines).encode("utf-8", "surrogateescape"))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def reads_environment(command: list[str]) -> bool:
    """Whether `command` runs ENVIRONMENT_STEP (`worker.launch.in_sandbox(..., environment_on_stdin=True)`),
    so that an `environment_file` must be its stdin."""
    n = len(ENVIRONMENT_STEP)
    return any(command[i : i + n] == ENVIRONMENT_STEP for i in range(len(command) - n + 1))
