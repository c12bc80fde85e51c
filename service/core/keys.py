"""Every Redis key and channel towerq uses, in one place.

Redis is transport only (queues, pub/sub, locks, kicks); the database holds the truth,
so anything under these keys can be rebuilt after a flush.
"""

PREFIX = "towerq:"

SCHEDULER_LOCK = PREFIX + "lock:scheduler"
"""Held while one scheduling pass runs, so passes never overlap across processes."""

SCHEDULER_KICK = PREFIX + "scheduler:kick"
"""A list; pushing to it asks the scheduler for a pass now instead of at its next tick."""

SWEEPS_DUE = PREFIX + "scheduler:sweeps-due"
"""Set with a kick when a setting of an adaptive sweep reported at a rung: the scheduler
decides the sweeps' rungs after that pass, not at its next look (`service.jobs.asha`)."""

LAB_OWNER = PREFIX + "lab"
"""The identity of the service whose keys these are, in database 0 of the server whatever
number the service uses (`service.core.keyspace`)."""

JOBS_CHANNEL = PREFIX + "jobs"
"""Pub/sub channel carrying every job's state changes (the list-level stream)."""


def host_queue(host: str) -> str:
    """Name of the RQ queue a host's worker listens on."""
    return f"{PREFIX}host:{host}"


def job_channel(job_id: int) -> str:
    """Pub/sub channel for one job's metrics, logs and state changes."""
    return f"{PREFIX}job:{job_id}"


def host_control_channel(host: str) -> str:
    """Pub/sub channel a host's worker listens on for stop requests."""
    return f"{PREFIX}control:{host}"


def stream_slots(token_id: int) -> str:
    """A sorted set of one token's open live streams (slot -> last refresh), for the cap."""
    return f"{PREFIX}streams:{token_id}"


def member_stream_slots(user_id: int) -> str:
    """The same for one member, all their tokens together."""
    return f"{PREFIX}member-streams:{user_id}"


def refused_count(host: str) -> str:
    """A counter of the messages a host's worker found on its queue and refused to run."""
    return f"{PREFIX}refused:{host}"


PASS_HISTOGRAM = "towerq:scheduler:pass_seconds"
"""Hash of scheduling-pass durations by histogram bucket, and their sum (`/metrics`)."""
