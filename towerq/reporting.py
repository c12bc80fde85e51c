"""`towerq.report()`: a command job's numbers, from inside its sandbox, with nothing to install.

    import towerq
    towerq.report(step=120, loss=0.31, accuracy=0.9)          # a training point
    towerq.report(step=120, split="eval", loss=0.35, f1=0.8)  # an evaluation, a custom metric
    towerq.report(step=120, loss=0.31, total_steps=5000)      # and how many steps it runs
    towerq.report_logs(120, {"loss": 0.31, "val_loss": 0.35})  # a framework's logs dict

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
from collections.abc import Mapping
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


EVAL_PREFIXES = ("eval_", "val_")
"""How frameworks name held-out numbers in their logs: Hugging Face's `eval_loss`, Keras'
`val_accuracy`."""


def report_logs(step: int, logs: Mapping[str, Any], *, total_steps: int | None = None) -> None:
    """A framework's dict of numbers as towerq's points at `step`: Keras' `logs`, Hugging
    Face's `on_log`/`on_evaluate` dict, Lightning's `callback_metrics`. A name that begins
    `eval_` or `val_` goes, without it, into an evaluation (`val_accuracy`: its accuracy),
    every other into a training point; a value that is not a number (a string, a list) is
    left out, as are `step` and `split`; a name towerq cannot keep is made one
    (`train/loss`: `train.loss`), and past 16 names of its own a split keeps the first 16."""
    splits: dict[str, dict[str, Any]] = {"train": {}, "eval": {}}
    for key, value in logs.items():
        number = _loose_number(value)
        if number is None:
            continue
        split = "eval" if str(key).startswith(EVAL_PREFIXES) else "train"
        name = _metric_name(str(key).split("_", 1)[1] if split == "eval" else str(key))
        if name is None or name in RESERVED:
            continue
        kept = splits[split]
        if name not in kept and (name in STANDARD or sum(n not in STANDARD for n in kept) < MAX_CUSTOM):
            kept[name] = number
    if splits["train"] or total_steps is not None:
        report(step, total_steps=total_steps, **splits["train"])
    if splits["eval"]:
        report(step, split="eval", **splits["eval"])


RESERVED = ("step", "split", "total_steps")
"""Names `report` takes as its own: a log's `step` is not a metric (the step is given)."""


def _loose_number(value: Any) -> float | None:
    """`value` as a number where it is one (a float, a numpy scalar, a 0-d tensor), else None."""
    if value is None or isinstance(value, str | bytes | bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _metric_name(name: str) -> str | None:
    """`name` as a metric name towerq keeps (`CUSTOM_NAME`): `/` and other characters as `.`
    or `_`, at most 48; None for none left."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", name.replace("/", "."))[:48]
    if name and not (name[0].isalpha() or name[0] == "_"):
        name = f"_{name}"[:48]
    return name if name and CUSTOM_NAME.match(name) else None


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
