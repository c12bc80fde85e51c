"""Webhooks when jobs end: the job's `notify_url` (or its sweep's) and the lab's
`TOWERQ_WEBHOOK_URL`; to the same, `job.idle` when a running job's GPUs have been idle for
`TOWERQ_GPU_IDLE_WARN_S` (once for each idle stretch, owed with the report that says so:
`service.core.gpu_use.store_gpu_use`); and a sweep's `notify_url` once more when its last
job has ended (`sweep.finished`: the best setting, how many it stopped early), owed by the
scheduler (`owe_sweep_notifications`).

The transaction that ends a job also writes a `Notification` row per target (an outbox),
so a notification is neither lost when a process dies nor made twice. The `Deliverer`, a
thread of the scheduler process, sends what is due: a JSON POST with the job's state,
reason, final metrics and dashboard link, a Slack-compatible `text`, and, with
`TOWERQ_WEBHOOK_SECRET`, the header `X-Towerq-Signature: sha256=<HMAC-SHA256 of the body>`.
`X-Towerq-Delivery` carries the notification's id, which stays the same across retries.
A failed attempt (no answer in 10 s, or not 2xx) is retried with back-off, up to
`MAX_ATTEMPTS` times over about six hours; each failure is a line in the job's log. A
member's URL goes only to public (or allow-listed) addresses, to the address that was
checked (`service.notifications.outbound`); no attempt takes longer than SEND_DEADLINE_S in all, and no
answer's body is read (its status is all that counts).

Nothing here runs on a worker or inside a scheduling pass: a slow receiver slows nobody.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import anyio
import httpx
from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from service.core import joblog
from service.core.context import Context
from service.core.db import Database
from service.core.models import (
    FINAL_STATES,
    JOB_FINISHED,
    JOB_IDLE,
    Job,
    Notification,
    NotificationState,
    Sweep,
    SweepRung,
    utcnow,
)
from service.core.models.jobs import gpu_use_summary, idle_text
from service.core.results import best_job, counts_by_state, result_of
from service.core.schemas.jobs import LatestMetrics
from service.core.sharing import LAB, error_category
from service.notifications import outbound
from towerq.contract.attempts import GPU_BUSY_PCT

log = logging.getLogger(__name__)

BACKOFF_STEPS = (1, 5, 15, 60, 300, 900, 1800, 7200)
"""Waits before each retry, in units of TOWERQ_WEBHOOK_RETRY_S (2 s: 2 s, 10 s, 30 s, 2 min,
10 min, 30 min, 1 h, 4 h: about 6 hours in all)."""
MAX_ATTEMPTS = len(BACKOFF_STEPS) + 1
SEND_TIMEOUT_S = 10.0
SEND_DEADLINE_S = 20.0
"""One attempt, connection to status line, never takes longer (a receiver that drips its
answer would otherwise hold the lab's one delivery thread)."""
LEASE_S = 60.0
"""A claimed notification is not claimed again for this long (another deliverer, a crash)."""
POLL_S = 1.0
SWEEP_FINISHED = "sweep.finished"
FINAL = [state.value for state in FINAL_STATES]
BATCH = 20


def slack_text(text: str) -> str:
    """`text` as plain words in a Slack (or Mattermost) message: `&`, `<` and `>` escaped, so a
    job's name or error cannot mention `<!channel>` or make a link of its own."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def about(job: Job) -> dict[str, Any]:
    """What every job webhook says of its job first."""
    return {"id": job.id, "name": job.name, "user": job.user.name, "state": job.state}


def job_link(public_url: str, job: Job) -> str:
    return f"{public_url.rstrip('/')}/#/jobs/{job.id}"


def payload(job: Job, delivery: int, public_url: str, lab_wide: bool = False) -> dict[str, Any]:
    """The body of a job's webhook. `lab_wide` (the lab's TOWERQ_WEBHOOK_URL, which every
    member reads): a private job's error is said as a category, not in its own words."""
    link = job_link(public_url, job)
    error = error_category(job.error) if lab_wide and job.spec.get("visibility") != LAB else job.error
    latest = LatestMetrics.model_validate(job).model_dump()
    final = {k: v for k, v in latest.items() if v is not None}
    summary = ", ".join(
        f"{k.replace('_', ' ')} {100 * v:.1f}%" if "accuracy" in k else f"{k.replace('_', ' ')} {v:.4g}"
        for k, v in final.items()
        if k in ("eval_accuracy", "eval_loss", "accuracy", "loss")
    )
    reason = f" ({error})" if error else ""
    text = slack_text(f"towerq: job {job.id} {job.name!r} of {job.user.name} {job.state}{reason}")
    text += f" — {summary}" if summary else ""
    return {
        "event": JOB_FINISHED,
        "delivery": delivery,
        "job": {
            **about(job),
            "reason": error,
            "attempts": job.attempts,
            "final": final,
            "sweep_id": job.sweep_id,
            "started_at": job.started_at.isoformat() if job.started_at else None,
            "finished_at": job.finished_at.isoformat() if job.finished_at else None,
            "url": link,
        },
        "text": f"{text} <{link}>",
    }


def idle_payload(job: Job, delivery: int, public_url: str) -> dict[str, Any]:
    """The body of `job.idle`: whose job holds GPUs idle, where, since when (null once they
    are busy again), and its busy share so far."""
    link = job_link(public_url, job)
    use = gpu_use_summary(job.gpu_use, job.attempts) or {}
    said = idle_text(use) or f"its GPUs were idle (busy under {GPU_BUSY_PCT:g}% at every sample)"
    where = f"{job.state} on {job.host_name}" if job.host_name else job.state
    gpus = f"{job.gpu_count} GPU{'' if job.gpu_count == 1 else 's'}"
    text = slack_text(f"towerq: job {job.id} {job.name!r} of {job.user.name} ({where}, {gpus}): {said}")
    return {
        "event": JOB_IDLE,
        "delivery": delivery,
        "job": {
            **about(job),
            "host": job.host_name,
            "gpu_count": job.gpu_count,
            "idle_since": use.get("idle_since"),
            "busy_pct": use.get("busy_pct"),
            "url": link,
        },
        "text": f"{text} <{link}>",
    }


def sweep_payload(session: Session, sweep: Sweep, delivery: int, public_url: str) -> dict[str, Any]:
    """The body of a sweep's webhook, when its last job ended: its jobs by state, the best
    setting and its result, and how many settings it stopped early (an adaptive sweep)."""
    jobs = list(session.scalars(select(Job).where(Job.sweep_id == sweep.id).order_by(Job.id)))
    metric, goal = sweep.spec["metric"], sweep.spec["goal"]
    counts = counts_by_state(jobs)
    stopped = session.scalar(select(func.count()).where(SweepRung.sweep_id == sweep.id, SweepRung.stopped.is_(True)))
    best_id = best_job(jobs, metric, goal)
    settings = sweep.spec.get("settings") or []
    best = None
    if best_id is not None:
        place = next(i for i, job in enumerate(jobs) if job.id == best_id)
        best = {
            "job_id": best_id,
            "setting": settings[place] if place < len(settings) else {},
            "value": result_of(jobs[place], metric),
        }
    link = f"{public_url.rstrip('/')}/#/sweeps/{sweep.id}"
    states = ", ".join(f"{state} {n}" for state, n in sorted(counts.items()))
    text = f"towerq: sweep {sweep.id} {sweep.name!r} of {sweep.user.name} finished: {len(jobs)} jobs ({states})"
    if best is not None:
        shown = ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in best["setting"].items())
        text += f"; best: job {best_id} ({shown}), {metric} {best['value']:.4g}"
    text += f"; {stopped} stopped early" if stopped else ""
    return {
        "event": "sweep.finished",
        "delivery": delivery,
        "sweep": {
            "id": sweep.id,
            "name": sweep.name,
            "user": sweep.user.name,
            "metric": metric,
            "goal": goal,
            "counts": counts,
            "total": len(jobs),
            "best": best,
            "stopped_early": stopped or 0,
            "url": link,
        },
        "text": f"{slack_text(text)} <{link}>",
    }


def owe_sweep_notifications(db: Database, since: datetime) -> int:
    """Owe `sweep.finished` to each sweep with a `notify_url` whose jobs have all ended (one
    of them after `since`) and that is not owed one yet; how many. Run by the scheduler (one
    process, one thread): looked at once a sweep is done, so two last jobs ending at once
    cannot both miss it, and none is owed twice. Read first: a write only when one is owed."""
    recent = select(Job.sweep_id).where(Job.sweep_id.is_not(None), Job.finished_at >= since).distinct()
    unfinished = select(Job.sweep_id).where(Job.sweep_id.is_not(None), Job.state.not_in(FINAL)).distinct()
    owed = (
        select(Job.sweep_id)
        .join(Notification, Notification.job_id == Job.id)
        .where(Notification.event == SWEEP_FINISHED)
    )
    done = select(Sweep.id, Sweep.spec).where(Sweep.id.in_(recent), Sweep.id.not_in(unfinished), Sweep.id.not_in(owed))
    with db.read() as session:
        due = [sweep_id for sweep_id, spec in session.execute(done) if (spec or {}).get("notify_url")]
    if not due:
        return 0
    with db.write() as session:
        for sweep_id in due:
            sweep = session.get(Sweep, sweep_id)
            last = session.scalar(select(Job.id).where(Job.sweep_id == sweep_id).order_by(Job.finished_at.desc()))
            if sweep is not None and last is not None:
                session.add(Notification(job_id=last, url=sweep.spec["notify_url"], event=SWEEP_FINISHED))
    return len(due)


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Deliverer:
    """Sends due notifications until `stop` is set (a thread of `towerq scheduler`)."""

    def __init__(self, ctx: Context, stop: threading.Event, deadline_s: float = SEND_DEADLINE_S) -> None:
        self.ctx = ctx
        self.stop = stop
        self.deadline_s = deadline_s
        self.thread = threading.Thread(target=self.run, name="webhooks", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                sent = self.deliver_due()
            except Exception:  # noqa: BLE001 - the database was away: try again later
                log.exception("webhook delivery pass failed")
                sent = 0
            if not sent:
                self.stop.wait(POLL_S)

    def deliver_due(self) -> int:
        """Claim and send the notifications that are due; how many were tried."""
        tried = 0
        for notification_id in self._due():
            if self._claim(notification_id):
                self._send(notification_id)
                tried += 1
        return tried

    def _due(self) -> list[int]:
        with self.ctx.db.read() as session:
            query = (
                select(Notification.id)
                .where(Notification.state == NotificationState.PENDING, Notification.next_attempt_at <= utcnow())
                .order_by(Notification.next_attempt_at)
                .limit(BATCH)
            )
            return list(session.scalars(query))

    def _claim(self, notification_id: int) -> bool:
        """Lease it, so no other deliverer sends it meanwhile; False if another got it."""
        now = utcnow()
        with self.ctx.db.write() as session:
            claimed = session.execute(
                update(Notification)
                .where(
                    Notification.id == notification_id,
                    Notification.state == NotificationState.PENDING,
                    Notification.next_attempt_at <= now,
                )
                .values(next_attempt_at=now + timedelta(seconds=LEASE_S))
            )
            return bool(claimed.rowcount)  # type: ignore[attr-defined]

    def _send(self, notification_id: int) -> None:
        settings = self.ctx.settings
        with self.ctx.db.read() as session:
            notification = session.get(Notification, notification_id)
            assert notification is not None
            job = session.get(Job, notification.job_id)
            assert job is not None
            url = notification.url or settings.webhook_url
            event = notification.event
            sweep = session.get(Sweep, job.sweep_id) if event == SWEEP_FINISHED and job.sweep_id else None
            if sweep is not None:
                said = sweep_payload(session, sweep, notification.id, _public(settings))
            elif event == JOB_IDLE:
                said = idle_payload(job, notification.id, _public(settings))
            else:
                said = payload(job, notification.id, _public(settings), lab_wide=notification.url is None)
            body = json.dumps(said).encode() if url else b""
        if not url:  # no lab webhook configured: nothing is owed
            with self.ctx.db.write() as session:
                session.execute(delete(Notification).where(Notification.id == notification_id))
            return
        headers = {"Content-Type": "application/json", "X-Towerq-Event": said["event"]}
        headers["X-Towerq-Delivery"] = str(notification_id)
        if settings.webhook_secret:
            headers["X-Towerq-Signature"] = sign(settings.webhook_secret, body)
        error = self.post(url, body, headers, checked=notification.url is not None)
        if error is None:
            self._delivered(notification_id)
        else:
            self._failed(notification_id, url, error)

    def post(self, url: str, body: bytes, headers: dict[str, str], checked: bool) -> str | None:
        """POST `body` to `url`; None when it answered 2xx, else what went wrong. With
        `checked` (a member's URL) only to the public address it was resolved to."""
        request_url, extensions = httpx.URL(url), dict[str, Any]()
        if checked:
            try:
                address = outbound.resolve(url, self.ctx.settings.webhook_allow)
            except outbound.RefusedAddressError as err:
                return str(err)
            headers = {**headers, "Host": request_url.netloc.decode()}
            extensions = {"sni_hostname": request_url.host}
            request_url = request_url.copy_with(host=address)
        try:
            # An event loop of its own, on a thread of its own: the caller's thread may run one.
            with ThreadPoolExecutor(1, thread_name_prefix="webhook") as attempt:
                return attempt.submit(anyio.run, self._post, request_url, body, headers, extensions).result()
        except TimeoutError:
            return f"no answer within {self.deadline_s:g} s"
        except httpx.HTTPError as err:
            return f"{type(err).__name__}: {err}"

    async def _post(
        self, url: httpx.URL, body: bytes, headers: dict[str, str], extensions: dict[str, Any]
    ) -> str | None:
        """One attempt, cancelled at the deadline wherever it is (a dripping answer too)."""
        with anyio.fail_after(self.deadline_s):
            async with httpx.AsyncClient(timeout=SEND_TIMEOUT_S, follow_redirects=False) as client:
                request = client.build_request("POST", url, content=body, headers=headers, extensions=extensions)
                answer = await client.send(request, stream=True)  # the status is enough: no body is read
                await answer.aclose()
                return None if answer.is_success else f"HTTP {answer.status_code}"

    def _delivered(self, notification_id: int) -> None:
        with self.ctx.db.write() as session:
            notification = session.get(Notification, notification_id)
            assert notification is not None
            notification.state = NotificationState.DELIVERED
            notification.attempts += 1
            notification.delivered_at = utcnow()

    def _failed(self, notification_id: int, url: str, error: str) -> None:
        host = httpx.URL(url).host
        with self.ctx.db.write() as session:
            notification = session.get(Notification, notification_id)
            assert notification is not None
            notification.attempts += 1
            notification.last_error = error
            attempts = notification.attempts
            if attempts >= MAX_ATTEMPTS:
                notification.state = NotificationState.FAILED
                message = f"webhook to {host} failed for good after {attempts} attempts: {error}"
            else:
                wait = BACKOFF_STEPS[attempts - 1] * self.ctx.settings.webhook_retry_s
                notification.next_attempt_at = utcnow() + timedelta(seconds=wait)
                message = f"webhook to {host} failed (attempt {attempts} of {MAX_ATTEMPTS}): {error}"
                message += f"; next try in {wait:g} s"
            rows = joblog.towerq_lines(session, [notification.job_id], "warning", message)
        joblog.append_rows(self.ctx.settings.artifacts_dir, rows)
        log.warning("%s (job %s)", message, notification.job_id)


def _public(settings: Any) -> str:
    return str(settings.public_url or settings.api_url)
