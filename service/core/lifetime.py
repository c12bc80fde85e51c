"""Every process towerq starts dies with its parent: the kernel's parent-death signal.

A child asks the kernel (prctl PR_SET_PDEATHSIG) for a signal when the thread that started
it exits, so nothing outlives a `towerq` process killed with SIGKILL: not `towerq up`'s
API, scheduler, worker and embedded Redis, not uvicorn's API worker processes, not the
worker's own children outside the sandbox (a command job's process, pip). (The trainer does
the same for itself in `worker.trainer.__main__`, and `worker.gang` for its ranks: both run
in the sandbox, which shows no `service`.)
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        return prctl
    except OSError:  # not Linux: process groups and sessions still apply
        return None


_prctl = _load_prctl()  # resolved before any fork, so a preexec_fn only calls it


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """Have `signum` sent to this process when its parent dies; exit at once when the parent
    is already gone (it died before the request took effect)."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, int(signum))
    if os.getppid() != parent_pid:
        os._exit(1)


def dies_with_this_process(signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen`: the child, whatever program it runs, gets
    `signum` when the calling thread's process dies. Start children from the main thread:
    the kernel ties the signal to the thread that forked."""
    parent = os.getpid()
    return lambda: die_with_parent(parent, signum)
