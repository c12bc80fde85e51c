"""`towerq.report()`: a command job's numbers, from inside its sandbox, with nothing to install.

    import towerq
    towerq.report(step=120, loss=0.31, accuracy=0.9)          # a training point
    towerq.report(step=120, split="eval", loss=0.35, f1=0.8)  # an evaluation, a custom metric
    towerq.report(step=120, loss=0.31, total_steps=5000)      # and how many steps it runs

Each call prints one line of towerq's protocol on stdout (any language can print the same,
docs/command-jobs.md), and appends it to the job's metrics log so that a resumed attempt
restores the points its dead worker had not stored; in a job, after a newline, so that no
other process's part of a line comes before it. Outside a towerq job it prints the line
alone, so a script runs the same anywhere. Standard library only: the sandbox has no more.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from typing import Any

SPLITS = ("train", "eval")
STANDARD = ("loss", "accuracy", "learning_rate", "examples_per_sec")
MAX_CUSTOM = 16
CUSTOM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,47}$")
METRICS_LOG_ENV = "TOWERQ_METRICS_LOG"
JOB_ENV = "TOWERQ_JOB_ID"


def report(
    step: int,
    loss: float | None = None,
    accuracy: float | None = None,
    *,
    split: str = "train",
    total_steps: int | None = None,
    **metrics: float,
) -> None:
    """One point of the job's charts at `step` (an int from 0): `loss` and `accuracy` as
    towerq's trainer reports them, `learning_rate` and `examples_per_sec` if given, any other
    number by its name (at most 16 names, each a chart of its own). `split="eval"` for
    numbers of held-out data. A non-finite number is stored as missing. `total_steps` (with
    a train point): how many steps the program runs in all, which gives the job a progress
    bar and an ETA, and the scheduler its likely end."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**62:
        raise ValueError(f"towerq.report: step must be an int from 0 to 2**62, not {step!r}")
    if split not in SPLITS:
        raise ValueError(f"towerq.report: split must be 'train' or 'eval', not {split!r}")
    line: dict[str, Any] = {"event": "eval" if split == "eval" else "metric", "time": round(time.time(), 3)}
    line["step"] = step
    if total_steps is not None:
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or not 1 <= total_steps < 2**62:
            raise ValueError(f"towerq.report: total_steps must be an int from 1 to 2**62, not {total_steps!r}")
        if split == "eval":
            raise ValueError("towerq.report: total_steps goes with a train point (split='train')")
        line["total_steps"] = total_steps
    line["loss"] = _number("loss", loss)
    line["accuracy"] = _number("accuracy", accuracy)
    custom: dict[str, float | None] = {}
    for name, value in metrics.items():
        if name in STANDARD:
            line[name] = _number(name, value)
            continue
        if not CUSTOM_NAME.match(name):
            raise ValueError(f"towerq.report: {name!r} is not a metric name (letters, digits, _ . -; at most 48)")
        custom[name] = _number(name, value)
    if len(custom) > MAX_CUSTOM:
        raise ValueError(f"towerq.report: at most {MAX_CUSTOM} custom metrics, got {len(custom)}")
    if custom:
        line["metrics"] = custom
    text = json.dumps(line, allow_nan=False)
    _keep(text)
    # In a job, the line starts a line of its own, in one write: processes that share the
    # program's stdout (torchrun's ranks, a DataLoader's workers) write lines in parts (an
    # unbuffered print writes its newline apart), and the point glued after another's part
    # of a line was text, lost. The empty line this may leave is dropped from the log.
    lead = "\n" if os.environ.get(JOB_ENV) else ""
    sys.stdout.write(lead + text + "\n")
    sys.stdout.flush()


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"towerq.report: {name} must be a number, not {value!r}")
    try:
        number = float(value)  # a numpy scalar, a 0-d tensor's .item() ...
    except (TypeError, ValueError):
        raise TypeError(f"towerq.report: {name} must be a number, not {type(value).__name__}") from None
    return number if math.isfinite(number) else None


def _keep(text: str) -> None:
    """Append the line (with its attempt) to the job's metrics log, when in a job."""
    path = os.environ.get(METRICS_LOG_ENV)
    if not path:
        return
    attempt = os.environ.get("TOWERQ_ATTEMPT", "1")
    with open(path, "a", encoding="utf-8") as log:
        log.write(text[:-1] + f', "attempt": {int(attempt) if attempt.isdigit() else 1}}}\n')
