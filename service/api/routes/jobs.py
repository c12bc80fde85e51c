"""Jobs: submit, list, inspect, follow, cancel."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from pydantic import TypeAdapter
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.api.deps import CallerDep, DatabaseDep, ExecutorDep, InventoryDep, SessionDep, SettingsDep, WriterDep
from service.core import defaults
from service.core.exceptions import SpecError
from service.core.lifecycle import locked_job, request_cancel
from service.core.models import JobState, LogLine
from service.core.schemas.jobs import DryRunOut, JobDetailOut, JobPage, LogLineOut, MetricOut
from service.jobs import privacy, series
from service.jobs.change import JobChange, change_job
from service.jobs.dependencies import resolve_after
from service.jobs.holds import hold_job, release_job
from service.jobs.read import as_seen_by, get_job, job_detail, list_jobs
from service.jobs.redeliver import send_again
from service.jobs.stopping import cancel_then_stop
from service.jobs.submit import check_notebook, check_startable, check_submission, submit
from service.lab.groups import resolve_group
from service.scheduler.dryrun import estimate
from towerq.contract.api import LOG_LINES_KEPT, LOG_TRIMMED_HEADER
from towerq.contract.messages import CancelMessage
from towerq.contract.spec import JobSpec

router = APIRouter(prefix="/api/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="job id")]
Step = Annotated[int, Query(ge=-1, le=2**31 - 1)]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=128)]
STATES = [s.value for s in JobState]


@router.post("", status_code=201, response_model=JobDetailOut)
def submit_job(
    spec: JobSpec,
    caller: CallerDep,
    db: DatabaseDep,
    settings: SettingsDep,
    inventory: InventoryDep,
    writer: WriterDep,
    idempotency_key: IdempotencyKey = None,
    dry_run: Annotated[
        bool, Query(description="store nothing: check the spec and say when it would start if submitted now")
    ] = False,
) -> Response:
    """Submit a training job; it starts queued. A repeated Idempotency-Key returns the first
    job. With `dry_run=true` nothing is stored: the answer (200, `DryRunOut`) says whether it
    would start now, or where it would stand in the queue and when and where it would
    likely start (the scheduler's forward replay of the live queue)."""
    if dry_run:
        host = check_submission(caller, spec, settings, inventory)
        if spec.is_notebook:
            check_notebook(db, caller, spec, settings, inventory)
        with db.read() as session:
            spec.group = resolve_group(session, caller, spec.group)
            check_startable(session, caller, spec, settings)
            after = resolve_after(session, caller, spec)  # the refusals a submit would give
            answer = estimate(session, settings, caller.name, spec, host, after)
        body = DryRunOut(dry_run=True, **answer.__dict__).model_dump_json()
        return Response(body, 200, media_type="application/json")
    detail, created = submit(db, caller, spec, settings, idempotency_key, inventory, writer)
    # Serialised once, by pydantic, instead of validated again by FastAPI.
    headers = {} if created else {"Idempotent-Replayed": "true"}
    shown = as_seen_by(detail, caller)  # a replayed key's job may have run
    return Response(shown.model_dump_json(), 201 if created else 200, headers, media_type="application/json")


@router.get("", response_model=JobPage)
def jobs(
    request: Request,
    session: SessionDep,
    caller: CallerDep,
    state: Annotated[list[str] | None, Query(max_length=6, description=f"any of {', '.join(STATES)}")] = None,
    user: Annotated[str | None, Query(max_length=64)] = None,
    q: Annotated[str | None, Query(max_length=128, description="text in the name, or an id")] = None,
    limit: Annotated[int, Query(ge=1, le=defaults.MAX_PAGE_SIZE)] = defaults.JOB_PAGE_SIZE,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> Response:
    """List jobs, newest first, filtered by state, user or text; paginated. Answers 304 to
    an If-None-Match naming the page's current ETag (cheap polling)."""
    states = _states(state)
    page = list_jobs(session, states=states, user=user, text=q, limit=limit, offset=offset)
    page.items = [as_seen_by(item, caller) for item in page.items]
    body = page.model_dump_json().encode()
    etag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})


def _states(values: list[str] | None) -> list[str]:
    states = [s for value in values or [] for s in value.split(",") if s]
    unknown = [s for s in states if s not in STATES]
    if unknown:
        raise SpecError("state", f"unknown state {unknown[0]!r}: use {', '.join(STATES)}")
    return states


@router.get("/{job_id}", response_model=JobDetailOut)
def job(job_id: JobId, session: SessionDep, caller: CallerDep) -> JobDetailOut:
    """One job: spec, state, allocation, what each attempt held (`held`), history, latest metrics."""
    found = get_job(session, job_id)
    shown = as_seen_by(job_detail(session, found), caller)
    return shown.model_copy(update={"outputs_readable": privacy.may_read_outputs(found, caller)})


@router.get("/{job_id}/metrics", response_model=list[MetricOut])
def metrics(
    job_id: JobId,
    session: SessionDep,
    _: CallerDep,
    after_step: Step = -1,
    until_step: Step | None = None,
    split: Annotated[str | None, Query(pattern="^(train|eval)$")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 20_000,
    points: Annotated[int | None, Query(ge=4, le=20_000)] = None,
) -> Any:
    """The job's metric series, in step order, after `after_step` (and up to `until_step`).
    With `points`, a series longer than that comes down-sampled on the server: the steps
    split into `points / 2` equal buckets per split, each giving its lowest- and
    highest-loss rows, so spikes and dips survive (a chart of 100,000 steps needs no more
    than its width in points; a chart zoomed in asks again for its range)."""
    get_job(session, job_id)
    if points is None:
        return series.metric_rows(session, job_id, after=after_step, until=until_step, split=split, limit=limit)
    rows = series.overview(session, job_id, after=after_step, until=until_step, split=split, points=points)
    # Serialised once, by pydantic, from the plain rows (FastAPI would validate them again).
    body = METRIC_ROWS.dump_json(METRIC_ROWS.validate_python(rows, from_attributes=True))
    return Response(body, media_type="application/json")


METRIC_ROWS = TypeAdapter(list[MetricOut])


@router.get("/{job_id}/logs", response_model=list[LogLineOut])
def logs(
    job_id: JobId,
    session: SessionDep,
    caller: CallerDep,
    response: Response,
    after_id: Annotated[int, Query(ge=0, le=2**62)] = 0,
    tail: Annotated[int, Query(ge=1, le=LOG_LINES_KEPT)] = 1000,
) -> list[LogLine]:
    """The trainer's log lines: the last `tail` of them, or those after `after_id`. Where
    older lines were trimmed (the database keeps a job's newest lines; its `log.txt` all of
    them), `X-Towerq-Log-Trimmed-Through` names the newest trimmed: a reader after an older
    line missed some."""
    job = get_job(session, job_id)
    privacy.check_outputs(job, caller)
    if job.log_trimmed_through is not None:
        response.headers[LOG_TRIMMED_HEADER] = str(job.log_trimmed_through)
    query = select(LogLine).where(LogLine.job_id == job_id)
    if after_id:
        return list(session.scalars(query.where(LogLine.id > after_id).order_by(LogLine.id).limit(tail)))
    newest = list(session.scalars(query.order_by(LogLine.id.desc()).limit(tail)))
    return newest[::-1]


@router.patch("/{job_id}", response_model=JobDetailOut)
def change(
    job_id: JobId, body: JobChange, db: DatabaseDep, caller: CallerDep, settings: SettingsDep, executor: ExecutorDep
) -> JobDetailOut:
    """Rename a job, share its log and artifacts, change a queued job's priority, or its time
    limit until it ends (owner or admin; once it started, only an admin lengthens it: 403).
    A running job's new limit counts from its attempt's start: past it, it stops now."""
    with db.write() as session:
        change_job(session, job_id, body, caller, settings, executor)
        return as_seen_by(job_detail(session, get_job(session, job_id)), caller)


@router.post("/{job_id}/hold", response_model=JobDetailOut)
def hold(job_id: JobId, db: DatabaseDep, caller: CallerDep, executor: ExecutorDep) -> JobDetailOut:
    """Put a queued job on hold (owner or admin): it stays queued but starts only once
    released; its reason says who holds it. On Slurm, a job handed over and still pending
    there is held there too (`scontrol hold`). 409 for a job that is not queued (or pending
    in Slurm)."""
    with db.write() as session:
        hold_job(session, job_id, caller, executor)
        return as_seen_by(job_detail(session, get_job(session, job_id)), caller)


@router.post("/{job_id}/release", response_model=JobDetailOut)
def release(job_id: JobId, db: DatabaseDep, caller: CallerDep, executor: ExecutorDep) -> JobDetailOut:
    """Release a job on hold: the scheduler places it again, as if it had waited only while
    it was not on hold. Its holder or an admin (an admin's hold: only an admin); 409 for a
    job that is not on hold."""
    with db.write() as session:
        release_job(session, job_id, caller, executor)
        return as_seen_by(job_detail(session, get_job(session, job_id)), caller)


@router.post("/{job_id}/notifications/{delivery}/resend", status_code=202, response_model=JobDetailOut)
def resend_notification(
    job_id: JobId,
    delivery: Annotated[int, Path(ge=1, le=2**63 - 1, description="the delivery's number (its `id`)")],
    db: DatabaseDep,
    caller: CallerDep,
) -> JobDetailOut:
    """Send a failed webhook delivery again (owner or admin), once its receiver is mended:
    the same body and `delivery` number, at once, then with its retries afresh. 404 if the
    job has no delivery of that number, 409 unless it failed (a pending one is on its way,
    one delivered is not sent twice)."""
    with db.write() as session:
        send_again(session, job_id, delivery, caller)
    with db.read() as session:
        return as_seen_by(job_detail(session, get_job(session, job_id)), caller)


@router.post("/{job_id}/cancel", status_code=202, response_model=JobDetailOut)
def cancel(job_id: JobId, db: DatabaseDep, caller: CallerDep, executor: ExecutorDep) -> JobDetailOut:
    """Cancel a queued job now, or ask a running one to checkpoint and stop."""

    def ask(session: Session) -> list[CancelMessage]:
        job = locked_job(session, job_id)
        caller.check_owner(job.user_id, f"job {job_id}", job.user.name, "cancel")
        stopping = request_cancel(session, job, caller.name)
        return [stopping] if stopping is not None else []

    cancel_then_stop(db, executor, ask)
    with db.read() as session:
        return as_seen_by(job_detail(session, get_job(session, job_id)), caller)
