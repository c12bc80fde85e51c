"""A child process that dies with its parent: `preexec_fn=die_with_parent` asks the kernel
(PR_SET_PDEATHSIG) to SIGKILL it when the thread that started it ends. Outside a sandbox
and a cgroup nothing else ends a process whose parent was killed. Its own module, with
nothing but the standard library, for the processes towerq starts outside the worker
(`worker.gang`, `worker.pyenv`)."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the thread that started it ends."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
