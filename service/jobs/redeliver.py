"""A job's webhook delivery that failed, sent again (`POST /api/jobs/{id}/notifications/{n}/resend`;
the job page's "Send again"), as GitHub redelivers a hook: once the receiver is mended (a
Slack hook URL fixed, a firewall opened), its owner or an admin sends it again, with the
same `delivery` number (a receiver that keeps them sees it is the one it missed) and its
retries afresh. Only a failed one: a pending one is on its way, and one delivered is not
sent twice (the lab's webhook, which every member reads, is not a member's to repeat)."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from service.core.exceptions import NotFoundError, StateConflictError
from service.core.lifecycle import locked_job
from service.core.models import Notification, NotificationState, utcnow
from service.lab.auth import Caller

log = logging.getLogger(__name__)


def send_again(session: Session, job_id: int, delivery: int, caller: Caller) -> Notification:
    """Queue the failed delivery `delivery` of job `job_id` again: the scheduler's deliverer
    sends it at once, then retries as for a new one. 404 if the job has none of that number,
    409 unless it failed."""
    job = locked_job(session, job_id)
    caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "send its webhooks again")
    notification = session.get(Notification, delivery, with_for_update=True)
    if notification is None or notification.job_id != job_id:
        raise NotFoundError(f"job {job_id} has no webhook delivery {delivery}")
    if notification.state != NotificationState.FAILED:
        why = "it is on its way" if notification.state == NotificationState.PENDING else "it got through"
        raise StateConflictError(
            f"webhook delivery {delivery} is {notification.state}: only a failed one is sent again ({why})"
        )
    notification.state = NotificationState.PENDING
    notification.attempts = 0
    notification.next_attempt_at = utcnow()
    log.info("job %s: webhook delivery %s (%s) sent again by %s", job_id, delivery, notification.event, caller.name)
    return notification
