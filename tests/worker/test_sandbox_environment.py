"""A program's environment comes on its stdin to the sandbox's first step after the drop
(`worker.sandbox_env.ENVIRONMENT_STEP`), quoted for sh by `environment_file`: what reaches the
program is the environment as given, whatever its values hold, and its stdin is /dev/null."""

from __future__ import annotations

import os
import subprocess

import pytest

from worker.launch import start_trainer
from worker.sandbox import SandboxError
from worker.sandbox_env import ENVIRONMENT_STEP, environment_file

TRICKY = {
    "PATH": "/usr/bin:/bin",
    "QUOTES": "it's \"quoted\" 'twice'",
    "SUBSTITUTIONS": "$(touch /tmp/x) `id` ${HOME} $$ \\ ;|&<>",
    "LINES": "first\nsecond\n\n",
    "EMPTY": "",
    "UNICODE": "Grüße, 東京 ✓",
    "IFS": "x",
}


def run(env: dict[str, str], *command: str) -> str:
    """`command` after ENVIRONMENT_STEP, given `env` on stdin, from an empty environment."""
    fd = environment_file(env)
    try:
        done = subprocess.run([*ENVIRONMENT_STEP, *command], stdin=fd, env={}, capture_output=True, timeout=30)
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_the_program_gets_its_environment_as_given_and_dev_null_for_stdin() -> None:
    shown = dict(entry.split("=", 1) for entry in run(TRICKY, "/usr/bin/env", "-0").split("\0") if entry)
    shown.pop("PWD", None)  # sh's own, as bwrap's (--chdir)
    assert shown == TRICKY
    assert run(TRICKY, "/usr/bin/readlink", "/proc/self/fd/0").strip() == "/dev/null"


def test_a_name_sh_cannot_export_is_refused() -> None:
    for name in ("A-B", "1A", "A B", "A=B", ""):
        with pytest.raises(SandboxError, match="not an environment variable's name"):
            environment_file({name: "x"})


def test_the_step_without_its_environment_file_runs_nothing_and_says_so(tmp_path) -> None:
    """A caller that put the step in a command but gave the environment to no one (stdin is
    /dev/null, or a file of its own): the program would start with an empty environment."""
    ran = tmp_path / "ran"
    with (tmp_path / "own").open("w+b") as own:
        for stdin in (subprocess.DEVNULL, own):
            done = subprocess.run(
                [*ENVIRONMENT_STEP, "/usr/bin/touch", str(ran)], stdin=stdin, env={}, capture_output=True, timeout=30
            )
            assert done.returncode == 127
            assert b"environment did not come on stdin" in done.stderr
            assert not ran.exists()


def test_an_environment_for_a_command_that_does_not_read_it_is_refused(tmp_path) -> None:
    """The other half of the same mistake: an environment given on stdin to a command without
    the step, which would start the program with none of it."""
    with pytest.raises(ValueError, match="does not read it on stdin"):
        start_trainer(["/usr/bin/env"], tmp_path, {}, program_env={"A": "1"})
    process = start_trainer([*ENVIRONMENT_STEP, "/usr/bin/env"], tmp_path, {}, program_env={"A": "1"})
    out, _ = process.communicate(timeout=30)
    assert b"A=1" in out.splitlines()
