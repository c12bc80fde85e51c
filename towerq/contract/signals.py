"""A command job's warning before its time limit: `"signal": "USR1@600"`, as Slurm's
`sbatch --signal=B:USR1@600`. The runner sends the signal to the program's own first
process (each rank's, with `"processes": "per_gpu"`) once, that many seconds before the
time limit stops it: time to finish an epoch and save, more than the SIGTERM's grace gives.
Its children are spared (a data loader's workers would die of a signal they do not handle).

The signals a program may ask for are those it would catch; SIGTERM is the stop itself,
SIGKILL and SIGSTOP cannot be caught. Without `@seconds`, 60, as Slurm's default."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

WARNING_SIGNALS = ("USR1", "USR2", "HUP", "INT", "ALRM")
DEFAULT_BEFORE_S = 60
MOST_BEFORE_S = 65535
"""Slurm's most: a warning at most about 18 hours ahead."""
_FORM = re.compile(r"^(?:B:)?(?:SIG)?([A-Z0-9]+)(?:@([0-9]{1,9}))?$")


def limit_signal(text: str) -> tuple[str, int]:
    """`USR1@600` (or `SIGUSR1@600`, `B:USR1@600`, `USR1`: 60 s) as (`USR1`, 600);
    ValueError in words for anything else."""
    found = _FORM.match(text.strip().upper())
    if found is None:
        raise ValueError(f"{text!r}: write SIGNAL@SECONDS, e.g. USR1@600 (the signal that many seconds before)")
    name, before = found[1], found[2]
    if name not in WARNING_SIGNALS:
        raise ValueError(
            f"{name}: a program is warned with one of {', '.join(WARNING_SIGNALS)} (SIGTERM is the stop itself)"
        )
    seconds = DEFAULT_BEFORE_S if before is None else int(before)
    if not 1 <= seconds <= MOST_BEFORE_S:
        raise ValueError(f"{seconds} s: the warning comes 1 to {MOST_BEFORE_S} s before the time limit")
    return name, seconds


def _normal(text: str) -> str:
    name, seconds = limit_signal(text)
    return f"{name}@{seconds}"


LimitSignal = Annotated[str, AfterValidator(_normal)]
"""A spec's `signal`, stored as `USR1@600`."""
