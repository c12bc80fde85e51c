"""What stopping a running job costs it, for every rule that stops one (preemption, time
slicing, an elastic job's resize) and for the replays that model the stop (the forecast,
the simulator)."""

from __future__ import annotations

from service.scheduler.types import INFINITY, RunningJob

CHECKPOINT_S = 30.0
"""A stopped job holds its GPUs this long (it writes a checkpoint first), in the simulator
and the forecast; the worker gives it `cancel_grace_s` (30 s by default)."""
RESTART_S = 60.0
"""Run time a stopped job loses when it starts again (process, graph, checkpoint restore)."""
STOP_COST_S = CHECKPOINT_S + RESTART_S
"""What stopping a job costs it: the checkpoint it writes, and the restart it pays again."""
MIN_RUN_S = 600.0
"""Time slicing stops no attempt younger than this, and an elastic job is resized no sooner
after its last start: starting a job again costs about a minute (`RESTART_S`), so each
slice or size pays for it at least ten times over."""


def sliceable_from(running: RunningJob, slice_gpu_s: float) -> float:
    """When time slicing (after `slice_gpu_s`) may first stop this attempt: once the job has
    served its slice, and the attempt has run `MIN_RUN_S` and as long as the earlier ones.
    A job over several hosts serves on all of them at once (`whole_load`)."""
    load = running.whole_load
    if load <= 0:
        return INFINITY
    to_serve = (slice_gpu_s - running.served_gpu_s) / load
    return running.started + max(to_serve, MIN_RUN_S, running.served_gpu_s / load)
