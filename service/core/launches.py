"""The launch message: the one wire contract between the scheduler and a host's worker.

A launch is an RQ job on the host's queue that calls `worker.agent.launch(job_id, attempt)`.
It is serialised as JSON, never pickle: reading what a Redis queue holds must not be able
to run code. The scheduler builds messages only with `send`; the worker runs only what
`check` accepts and refuses (logs, drops, counts) anything else found on its queue.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from service.core import defaults, keys

LAUNCH_FUNCTION = "worker.agent.launch"
SERIALIZER = JSONSerializer
PENDING = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED)


class NotALaunch(Exception):
    """A message on a host queue that is not one of towerq's launches."""


def launch_id(job_id: int, attempt: int, rank: int = 0) -> str:
    """The RQ job id of the message that launches this attempt (on the host of `rank`, for
    a job over several hosts: one message per host)."""
    return f"towerq-job-{job_id}-attempt-{attempt}" + (f"-rank-{rank}" if rank else "")


def host_queue(connection: redis.Redis, host: str) -> Queue:
    return Queue(keys.host_queue(host), connection=connection, serializer=SERIALIZER)


def send(connection: redis.Redis, host: str, job_id: int, attempt: int, rank: int = 0) -> None:
    """Put the launch message for this attempt on the host's queue. The message is the same
    for every rank of a job over several hosts: the worker finds its rank from the job's
    allocations."""
    host_queue(connection, host).enqueue_call(
        LAUNCH_FUNCTION,
        args=(job_id, attempt),
        timeout=defaults.RQ_LAUNCH_TIMEOUT_S,
        job_id=launch_id(job_id, attempt, rank),
        result_ttl=24 * 3600,
        failure_ttl=7 * 24 * 3600,
        description=f"launch job {job_id} attempt {attempt}",
    )


def pending(connection: redis.Redis, job_id: int, attempt: int, rank: int = 0) -> bool:
    """Whether this attempt's launch message (to the host of `rank`) is still waiting or being run."""
    try:
        message = RQJob.fetch(launch_id(job_id, attempt, rank), connection=connection, serializer=SERIALIZER)
        status = message.get_status()
    except NoSuchJobError:
        return False
    return status in PENDING


def check(message: RQJob) -> tuple[int, int]:
    """The (job id, attempt) of a launch message; raises NotALaunch for anything else,
    including a payload that is not JSON (a pickle is never unpickled)."""
    try:
        function, args, kwargs = message.func_name, message.args, message.kwargs
    except Exception as err:  # noqa: BLE001 - any payload we cannot read is refused, not run
        raise NotALaunch(f"unreadable payload ({type(err).__name__})") from None
    if function != LAUNCH_FUNCTION:
        raise NotALaunch(f"calls {str(function)[:200]!r}, not {LAUNCH_FUNCTION}")
    if kwargs or len(args) != 2 or not all(type(a) is int for a in args):
        raise NotALaunch(f"{LAUNCH_FUNCTION} takes (job_id, attempt), got {str(args)[:200]} {str(kwargs)[:200]}")
    return args[0], args[1]
