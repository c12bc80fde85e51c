"""A job's whole log as a file (`log.txt` in its artifacts): every line of every attempt.

The database keeps the newest lines of a job for the dashboard; the file keeps them all.
The worker's relay appends the trainer's lines; towerq's own lines about a job outside its
attempts (a webhook that failed, a waiting job's environment built ahead) come through
`towerq_lines` and `append_rows`. Each append is one write of whole lines to a file opened
for appending. It lives outside the job folder (`towerq.contract.paths.job_log`), which is
the trainer's to write, so user code can neither replace it nor plant a link there; it is
still opened without following links, as everything towerq opens on shared storage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.core.defaults import LOG_LINE_OVERHEAD
from service.core.models import Job, LogLine, utcnow
from service.core.publish import job_message
from towerq.contract.messages import LogMessage
from towerq.contract.paths import PathEscapeError, append_beneath, job_log

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


def towerq_lines(session: Session, job_ids: Sequence[int], level: str, message: str) -> dict[int, dict[str, Any]]:
    """A line of towerq's own in the log of each of `job_ids`, at its current attempt: its
    row, the line on the job's channel once `session` commits (a page open on it shows it
    at once), its bytes counted. The rows by job, for `append_rows` after the commit (a job
    gone has none)."""
    message = message[:10_000]
    now = utcnow()
    rows: dict[int, dict[str, Any]] = {}
    for job_id, attempt in session.execute(select(Job.id, Job.attempts).where(Job.id.in_(job_ids))):
        rows[job_id] = {"time": now, "attempt": attempt, "level": level, "message": message}
        session.add(LogLine(job_id=job_id, **rows[job_id]))
        job_message(session, LogMessage(job_id=job_id, **rows[job_id]))
    size = len(message.encode()) + LOG_LINE_OVERHEAD
    session.execute(update(Job).where(Job.id.in_(list(rows))).values(log_bytes=Job.log_bytes + size))
    return rows


def append_rows(artifacts_root: Path, rows: Mapping[int, Mapping[str, Any]]) -> None:
    """`towerq_lines`' rows to their jobs' log files (`towerq.contract.paths.job_log`)."""
    for job_id, row in rows.items():
        append(job_log(artifacts_root, job_id), [row])
