"""A job's whole log as a file (`log.txt` in its artifacts): every line of every attempt.

The database keeps the newest lines of a job for the dashboard; the file keeps them all.
The worker's relay appends the trainer's lines, the scheduler's webhook deliverer its own;
each append is one write of whole lines to a file opened for appending. The job folder is
the trainer's to write, so the file is opened without following links (a `log.txt` the
trainer replaced with a link or a FIFO is refused, said in the service's log): appending
must never reach a file outside the job.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from worker.trainer.paths import JOB_LOG_FILE, PathEscapeError, append_beneath

log = logging.getLogger(__name__)


def format_line(time: datetime, attempt: int, level: str, message: str) -> str:
    return f"{time:%Y-%m-%dT%H:%M:%S.%fZ} attempt {attempt} {level:<7} {message}\n"


def append(folder: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows (`time`, `attempt`, `level`, `message`) to the `log.txt` of the job
    folder `folder`; a failure is logged, not raised."""
    text = "".join(format_line(row["time"], row["attempt"], row["level"], row["message"]) for row in rows)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        append_beneath(folder, JOB_LOG_FILE, text)
    except (OSError, PathEscapeError) as err:
        log.warning("cannot append to %s in %s: %s", JOB_LOG_FILE, folder, err)
