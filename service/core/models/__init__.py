"""Database models: the source of truth for jobs, allocations, metrics, hosts and users.

One module per area (`base`, `people`, `hosts`, `jobs`, `results`); every model and name is
imported from here, and importing this package maps them all (Alembic's metadata included)."""

from service.core.models.base import (
    FINAL_STATES,
    HOLDING_STATES,
    UNSUCCESSFUL_STATES,
    Base,
    HostState,
    JobState,
    UTCDateTime,
    utcnow,
)
from service.core.models.hosts import Allocation, Gpu, Host, RankAddress, session_refusals
from service.core.models.jobs import Job, JobEvent, Sweep, SweepRung, expected_end_at, wait_start
from service.core.models.people import ApiToken, Group, GroupMember, Lab, Reservation, User
from service.core.models.results import (
    JOB_FINISHED,
    JOB_IDLE,
    LogLine,
    Metric,
    MetricRollup,
    Notification,
    NotificationState,
)

__all__ = [
    "FINAL_STATES",
    "HOLDING_STATES",
    "JOB_FINISHED",
    "JOB_IDLE",
    "UNSUCCESSFUL_STATES",
    "Allocation",
    "ApiToken",
    "Base",
    "Gpu",
    "Group",
    "GroupMember",
    "Host",
    "HostState",
    "Job",
    "JobEvent",
    "JobState",
    "Lab",
    "LogLine",
    "Metric",
    "MetricRollup",
    "Notification",
    "NotificationState",
    "RankAddress",
    "Reservation",
    "Sweep",
    "SweepRung",
    "UTCDateTime",
    "User",
    "expected_end_at",
    "session_refusals",
    "utcnow",
    "wait_start",
]
