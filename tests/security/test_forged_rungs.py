"""A setting of an adaptive sweep that reports its sweep's metric at a rung makes the
scheduler look at the sweep at once (`keys.SWEEPS_DUE` and a kick). Those rows are the
trainer's lines, so user code can print as many as it likes, at any steps, back and
forth: it still asks for at most one look a rung, not one a line (a look reads every
setting of every adaptive sweep)."""

from __future__ import annotations

import json
from collections.abc import Callable

from service.core import keys
from service.core.context import Context
from service.core.settings import Settings
from tests.worker.test_relay_rungs import EARLY, running_job
from worker.inventory import SimulatedInventory
from worker.launch import read_launch
from worker.runner import JobRunner

RUNGS = 3
"""EARLY on 400 steps: rungs at 50, 100 and 200."""


def test_a_trainer_that_floods_rung_steps_asks_for_one_look_a_rung(
    settings: Settings, add_host: Callable[..., None]
) -> None:
    add_host("lab-a", 1)
    ctx = Context.open(settings)
    try:
        job_id = running_job(ctx, settings, "mallory", EARLY)
        runner = JobRunner(ctx, SimulatedInventory("lab-a", 1), read_launch(ctx, job_id, 1, "lab-a"), lambda _: None)
        looks = 0
        for i in range(200):
            step = (50, 40, 100, 60, 200, 400, 50, 1)[i % 8]
            line = {"event": "eval", "step": step, "accuracy": 0.99, "loss": 0.1}
            runner._line("out", json.dumps(line).encode())
            runner.sink.flush(wait=True)
            looks += ctx.redis.getdel(keys.SWEEPS_DUE) is not None
        assert 1 <= looks <= RUNGS, f"{looks} looks asked by 200 lines"
        runner.sink.close()
    finally:
        ctx.close()
