"""Whether bubblewrap started an attempt's command, from bwrap's `--json-status-fd`
(`worker.sandbox_status`), with the real bwrap: a setup that fails (here a source path that
is not there; in a lab, a mount gone meanwhile, bubblewrap issue 650) is the sandbox's
failure, not the program's; a command that ran and failed, or one bwrap could not execute,
is the program's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from service.core.models import JobState
from worker.launch import start_trainer
from worker.outcome import Outcome, Stop
from worker.processes import output_lines
from worker.sandbox_status import sandbox_failed

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
VIEW = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"]
VIEW += ["--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--unshare-pid"]


def run(tmp_path: Path, *args: str) -> tuple[bool, int, list[str]]:
    """bwrap with `args` as an attempt starts it: (whether its sandbox failed, exit code, stderr)."""
    process = start_trainer(["bwrap", "--die-with-parent", *VIEW, *args], tmp_path, dict(os.environ))
    lines = [line for line in output_lines(process, 1.0) if line is not None]
    stderr = [raw.decode().rstrip("\n") for stream, raw in lines if stream == "err"]
    process.wait(30)
    return sandbox_failed(process, stderr), process.returncode, stderr


def test_a_setup_that_fails_is_the_sandboxs_and_a_command_that_fails_is_its_own(tmp_path: Path) -> None:
    failed, code, stderr = run(tmp_path, "--ro-bind", str(tmp_path / "gone"), "/data", "--", "true")
    assert failed and code == 1, stderr
    assert stderr[-1].startswith("bwrap: Can't find source path"), stderr

    failed, code, stderr = run(tmp_path, "--", "sh", "-c", "echo 'bwrap: Unable to apply mount flags' >&2; exit 1")
    assert not failed and code == 1, stderr  # what a program prints is no word of bwrap's

    failed, code, stderr = run(tmp_path, "--", "/no/such/program")
    assert not failed and code == 1 and stderr[-1].startswith("bwrap: execvp"), stderr

    failed, code, _ = run(tmp_path, "--", "true")
    assert not failed and code == 0


def test_an_attempt_whose_sandbox_never_started_queues_again_as_a_crash() -> None:
    said = ['bwrap: Unable to apply mount flags: remount "/data/users/x": No such file or directory']
    lost = Outcome(returncode=1, last_stderr=said, sandbox_failed=True, program=True)
    assert lost.verdict() == (JobState.QUEUED, f"the sandbox did not start ({said[0]}): queued again")
    assert lost.crashed  # counts against max_attempts: a sandbox that never starts ends the job in time
    cancelled = Outcome(returncode=1, last_stderr=said, sandbox_failed=True, stop=Stop.CANCEL, stop_message="by alice")
    assert cancelled.verdict() == (JobState.CANCELLED, "by alice") and not cancelled.crashed
    failed = Outcome(returncode=1, last_stderr=["no data"], program=True)
    assert failed.verdict() == (JobState.FAILED, "the program exited with code 1: no data") and not failed.crashed
