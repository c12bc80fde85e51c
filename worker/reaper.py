"""The end of an attempt's processes, and of an earlier attempt's on the same GPUs.

An attempt's processes are the one the worker started (bwrap, or the trainer or program
itself), its process group, what its cgroups hold (`worker.cgroups`) and every pid noted
while it ran (in the sandbox, bwrap's descendants by the host's numbers, as NVML lists
them). Killing them is SIGKILL to each of these and a wait until all are gone; its GPUs are
given back only once the driver no longer lists any of them there.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING

from sqlalchemy import select

from service.core.context import Context
from service.core.models import Allocation, Host
from towerq.contract.attempts import AttemptChannel
from worker.cgroups import AttemptGroup
from worker.inventory import Inventory
from worker.processes import kill_group, kill_pids, signal_trainer

if TYPE_CHECKING:
    from worker.attempt import AttemptRunner

log = logging.getLogger(__name__)

ZOMBIE_WAIT_S = 60.0
"""How long an attempt's GPUs wait for the driver to stop listing its processes."""
STACK_FRAMES = 8
"""Frames of a stuck runner's stack written to the worker log."""


def kill_attempt(
    process: subprocess.Popen[bytes], group: AttemptGroup, pids: set[int], sandboxed: bool, key: tuple[int, int]
) -> None:
    """SIGKILL whatever is left of the attempt's processes and wait until they are gone."""
    signal_trainer(process.pid, signal.SIGKILL, sandboxed)
    process.wait()
    if not kill_group(process.pid):
        log.error("the process group of job %s attempt %s outlived SIGKILL", *key)
    if not group.kill():  # what left the group (setsid, double fork) is still in the cgroup
        log.error("processes of job %s attempt %s outlived SIGKILL in its cgroup", *key)
    # in the sandbox they die a moment after bwrap; a copy: another runner may be the killer
    if not kill_pids(set(pids)):
        log.error("processes %s of job %s attempt %s outlived SIGKILL", pids, *key)


def wait_gpus_free(
    channel: AttemptChannel, inventory: Inventory, host: str, indices: list[int], pids: set[int]
) -> None:
    """Hold the GPUs until the driver no longer lists the attempt's processes on them; drain
    them (no new work there) when it still does after ZOMBIE_WAIT_S."""
    if inventory.wait_released(pids, indices, ZOMBIE_WAIT_S):
        return
    log.error("pids %s still hold GPUs %s of job %s: draining them", pids, indices, channel.job_id)
    channel.drain(host, indices)


def wait_for_earlier(runner: AttemptRunner, after: list[AttemptRunner]) -> None:
    """Before `runner`'s attempt starts: wait for the runners in `after` (those that had some
    of its GPUs) whose GPUs the database has released but which are still ending (a job over
    several hosts releases every host's GPUs when one rank records its end). One still not
    ended after the stop's grace and ZOMBIE_WAIT_S is stuck: its processes are killed here,
    and where its thread was goes to the worker log."""
    if not after:
        return
    ctx, launch = runner.lab, runner.launch
    for earlier in [r for r in after if r.thread.is_alive() and released(ctx, launch.host, r.key)]:
        job_id, attempt = earlier.key
        what = f"attempt {attempt}" if job_id == launch.job_id else f"job {job_id}"
        runner.sink.log("info", f"waiting for {what} to leave GPUs {earlier.launch.indices} on this host first")
        began = time.monotonic()
        earlier.join(ctx.settings.cancel_grace_s + ZOMBIE_WAIT_S + 10)
        if earlier.thread.is_alive():  # its GPUs are released, so its processes go now
            log.error(
                "the runner of job %s attempt %s did not end; killing its trainer. It was at:\n%s",
                *earlier.key,
                stack_of(earlier.thread),
            )
            earlier._kill_group()
        log.info("job %s attempt %s waited %.1f s for %s to leave", *runner.key, time.monotonic() - began, what)


def released(ctx: Context, host: str, key: tuple[int, int]) -> bool:
    """Whether the attempt `key` no longer holds GPUs on `host` in the database (a job
    sharing a GPU by memory fraction still does; one whose end was recorded does not)."""
    job_id, attempt = key
    with ctx.db.read() as session:
        held = session.scalar(
            select(Allocation.id)
            .join(Host, Host.id == Allocation.host_id)
            .where(
                Allocation.job_id == job_id,
                Allocation.attempt == attempt,
                Allocation.released_at.is_(None),
                Host.name == host,
            )
            .limit(1)
        )
    return held is None


def stack_of(thread: threading.Thread) -> str:
    """Where `thread` is now: its innermost frames, for a log line about a stuck runner."""
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)[-STACK_FRAMES:]) if frame is not None else "(it has ended)"
