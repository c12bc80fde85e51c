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
    served its slice, the attempt has run `MIN_RUN_S`, and the job's run (since it last left
    the queue) has served as much as it had before the run. For a job whose attempt is its
    run, that is: the attempt has run as long as the earlier ones. An elastic job's resize
    starts a new attempt but goes on with the run (`RunningJob.run_served_gpu_s`): counted
    from the resize, a job shrunk from 8 GPUs to 1 would have to run eight times its earlier
    time again, and one resized every `MIN_RUN_S` would never be sliced. A job over several
    hosts serves on all of them at once (`whole_load`)."""
    load = running.whole_load
    if load <= 0:
        return INFINITY
    served = running.served_gpu_s
    before = served if running.run_served_gpu_s is None else running.run_served_gpu_s
    to_serve = (slice_gpu_s - served) / load
    doubled = (2 * before - served) / load
    return running.started + max(to_serve, MIN_RUN_S, doubled)
