"""What one member may read of another's work.

Shared with the whole lab, always: the job list, each job's spec (less its webhook URLs),
state, allocation, metrics and charts, and its live state and metric events — a shared
dashboard is the point of towerq. Private to the job's owner and the admins unless the
job says `visibility: lab`: its log (`/logs`, `/logs.txt`, the stream's `log` events), its
artifacts (files, folders, the whole `.tar.gz`, the exported model) — a model trained on a
member's private data leaves only with them. Code bundles are readable by the members who
uploaded them, admins, and whoever may read the outputs of a job that runs on them. A
member's dataset uploads are theirs alone (service/uploads/datasets.py).
"""

from __future__ import annotations

from service.core.exceptions import ForbiddenError
from service.core.models import Job
from service.core.sharing import shares_outputs
from service.lab.auth import Caller


def may_read_outputs(job: Job, caller: Caller) -> bool:
    """Whether `caller` may read the job's log and artifacts."""
    return shares_outputs(job, caller.user_id, caller.is_admin)


def check_outputs(job: Job, caller: Caller) -> None:
    """ForbiddenError unless `caller` may read the job's log and artifacts."""
    if not may_read_outputs(job, caller):
        raise ForbiddenError(
            f"job {job.id}'s log and artifacts are private to {job.user.name} (and admins); "
            f"they can share them with `towerq share {job.id}` (visibility: lab)"
        )
