"""Running a bench script from a test: it starts a whole stack of its own (API, scheduler,
workers, Redis), so when the test gives up on it (its timeout, pytest's, or a failure) the
whole process group goes, not only the script: a script killed alone left its stack running
with no parent (found in a clean run where chaos outran pytest's 600 s under load). A pytest
worker killed outright (SIGTERM, SIGKILL: no `finally` runs) sends the script SIGTERM, by
the kernel's parent-death signal, and the script stops its stack (found when a clean run was
stopped: chaos ran on with its stack)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from service.core.lifetime import dies_with_this_process
from tests.stack import REPO

GRACE_S = 10.0


@dataclass
class BenchRun:
    returncode: int
    stdout: str
    stderr: str


def run_bench(*args: str, timeout: float) -> BenchRun:
    """`python bench/... args` in a session of its own; its group is ended on the way out."""
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=dies_with_this_process(signal.SIGTERM),  # a killed pytest worker ends it too
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        return BenchRun(process.returncode, stdout, stderr)
    finally:
        _end_group(process)


def _end_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the script's group (its stack stops its own trainers), then SIGKILL to
    what is left of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return  # nothing of the group is left
        try:
            process.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pass
