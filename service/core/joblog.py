"""A job's whole log as a file (`log.txt` in its artifacts): every line of every attempt.

The database keeps the newest lines of a job for the dashboard; the file keeps them all.
The worker's relay appends the trainer's lines, the scheduler's webhook deliverer its own;
each append is one write of whole lines to a file opened for appending. It lives outside
the job folder (`towerq.contract.paths.job_log`), which is the trainer's to write, so user
code can neither replace it nor plant a link there; it is still opened without following
links, as everything towerq opens on shared storage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from towerq.contract.paths import PathEscapeError, append_beneath

log = logging.getLogger(__name__)


def format_line(time: datetime, attempt: int, level: str, message: str) -> str:
    return f"{time:%Y-%m-%dT%H:%M:%S.%fZ} attempt {attempt} {level:<7} {message}\n"


def append(file: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append rows (`time`, `attempt`, `level`, `message`) to the job log `file`; a failure
    is logged, not raised."""
    text = "".join(format_line(row["time"], row["attempt"], row["level"], row["message"]) for row in rows)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        append_beneath(file.parent, file.name, text)
    except (OSError, PathEscapeError) as err:
        log.warning("cannot append to %s: %s", file, err)
