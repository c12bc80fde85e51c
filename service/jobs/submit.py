"""Submitting jobs: the checks a spec must pass beyond its own fields (GPUs that exist,
`fit`; files inside their roots, `spec_files`; the queue's room, limits and quotas), and
storing it."""

from __future__ import annotations

import secrets
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service.core.context import connect_redis
from service.core.db import Database
from service.core.exceptions import SpecError, TooManyError
from service.core.models import Group, Job, JobState, User, session_refusals, utcnow
from service.core.schemas.jobs import JobDetailOut
from service.core.settings import Settings
from service.executors import executor_for
from service.jobs.begin import deferred_s
from service.jobs.dependencies import resolve_after
from service.jobs.fit import check_memory_fraction, check_resources
from service.jobs.intake import Submission, SubmissionWriter, store_submissions
from service.jobs.read import get_job, job_detail, job_detail_of_new
from service.jobs.spec_files import check_files
from service.lab.auth import Caller
from service.lab.groups import resolve_group
from service.lab.hosts import HostInventory
from service.notifications import outbound
from service.uploads import code as code_bundles
from towerq.contract.spec import JobSpec, is_notebook
from towerq.contract.versions import SPEC_VERSION


def submit(
    db: Database,
    caller: Caller,
    spec: JobSpec,
    settings: Settings,
    idempotency_key: str | None = None,
    inventory: HostInventory | None = None,
    writer: SubmissionWriter | None = None,
) -> tuple[JobDetailOut, bool]:
    """Store a new queued job; returns (job, created). A repeated idempotency key returns
    the job first submitted with it. The checks read a cached inventory; the job is stored
    by `writer` (group commit) when there is one, else in a transaction of its own."""
    row = submission_row(db, caller, spec, settings, idempotency_key, inventory)
    if writer is not None:
        job_id, event = writer.store(row, caller.name)
    else:
        job_id, event = store_submissions(db, [Submission(row, caller.name)])[0]
    if event is None:
        with db.read() as session:
            return job_detail(session, get_job(session, job_id)), False
    return job_detail_of_new(Job(id=job_id, user=User(id=caller.user_id, name=caller.name), **row), event), True


def submission_row(
    db: Database,
    caller: Caller,
    spec: JobSpec,
    settings: Settings,
    idempotency_key: str | None = None,
    inventory: HostInventory | None = None,
    in_sweep: bool = False,
) -> dict[str, Any]:
    """The row of a new queued job once every check passed (raises SpecError naming the
    field, ForbiddenError, ...). A sweep's jobs were counted against the queue's room
    together, before it was stored."""
    inventory = inventory or HostInventory(db, executor_for(settings, connect_redis(settings.redis_url)))
    host = check_submission(caller, spec, settings, inventory)
    if spec.is_notebook:  # a sweep's specs were refused one by one before it was stored
        check_notebook(db, caller, spec, settings, inventory)
    if not in_sweep:
        check_queue_room(db, caller, 1, settings.user_max_queued_jobs)
    if spec.hyperparameters.seed is None:
        spec.hyperparameters.seed = secrets.randbelow(2**31)
    with db.read() as session:
        after = resolve_after(session, caller, spec)
        spec.group = resolve_group(session, caller, spec.group)
        check_startable(session, caller, spec, settings)
    row = new_job(caller, spec, host, settings, idempotency_key)
    row["sweep_id"] = None
    row["after_jobs"] = after
    row["after_condition"] = spec.after_condition if after else None
    return row


def check_startable(session: Session, caller: Caller, spec: JobSpec, settings: Settings) -> None:
    """Refuse a job no state of the lab could ever start (it would wait for ever): one that
    needs more GPUs at once than its owner's GPU limit or its group's quota allows. Run
    after its group is resolved."""
    gpus = spec.gpu_count or 1  # the spec made it len(gpus) when it names GPUs
    need = gpus * spec.gpu_memory_fraction
    asked = gpu_words(gpus) + (f" × {spec.gpu_memory_fraction:g}" if spec.gpu_memory_fraction < 1 else "")
    own = session.scalar(select(User.gpu_limit).where(User.id == caller.user_id))
    limit, source = (own, "their limit") if own is not None else (settings.user_gpu_limit, "TOWERQ_USER_GPU_LIMIT")
    if limit is not None and need > limit + 1e-9:
        raise SpecError(
            "gpu_count",
            f"{caller.name} may hold at most {gpu_words(limit)} at once ({source}); this job asks {asked}, "
            "so it could never start: ask for fewer",
        )
    if spec.group is None:
        return
    cap = session.scalar(select(Group.max_gpus).where(Group.name == spec.group))
    if cap is not None and need > cap + 1e-9:
        raise SpecError(
            "gpu_count",
            f"group {spec.group} may hold at most {gpu_words(cap)} at once (its quota); this job asks {asked}, "
            "so it could never start: ask for fewer, or an admin raises the quota (towerq group set)",
        )


def gpu_words(count: float) -> str:
    return f"{count:g} GPU{'' if count == 1 else 's'}"


def check_queue_room(db: Database, caller: Caller, adding: int, limit: int) -> None:
    """TooManyError when `adding` more jobs would put more than `limit` of the caller's jobs
    in the queue (0: no limit). A soft bound: submissions racing each other may each pass."""
    if not limit:
        return
    with db.read() as session:
        waiting = session.scalar(
            select(func.count()).select_from(Job).where(Job.state == JobState.QUEUED, Job.user_id == caller.user_id)
        )
    if (waiting or 0) + adding > limit:
        raise TooManyError(
            f"you have {waiting:,} jobs queued; at most {limit:,} may wait at once (TOWERQ_USER_MAX_QUEUED_JOBS): "
            "let some run or cancel some first"
        )


def check_submission(caller: Caller, spec: JobSpec, settings: Settings, inventory: HostInventory) -> str | None:
    """Everything a submission must pass besides the spec's own validation; the host the
    job must run on, if one."""
    caller.check_priority(spec.priority)
    host = check_resources(inventory, spec)
    check_memory_fraction(inventory, spec, host, settings)
    check_files(spec, settings, caller.name)
    if spec.code and not (caller.is_admin or code_bundles.owns(settings.code_dir, caller.name, spec.code)):
        raise SpecError("code", f"bundle {spec.code[:12]}… is not one you uploaded: upload it yourself (same id)")
    if spec.notify_url:
        outbound.check_url(spec.notify_url, settings.webhook_allow)
    if spec.network:
        check_network(caller, settings)
    if spec.max_attempts and spec.max_attempts > settings.max_attempts_limit and not caller.is_admin:
        raise SpecError(
            "max_attempts",
            f"at most {settings.max_attempts_limit} attempts a job (TOWERQ_MAX_ATTEMPTS_LIMIT); "
            "an admin's job may ask more",
        )
    return host


SESSION_STATES = (JobState.QUEUED, JobState.DISPATCHED, JobState.RUNNING)
"""A notebook session in these counts against the lab's caps on sessions."""


def check_hosts_run_notebooks(session: Session, spec: JobSpec, gpus: dict[str, list[int]]) -> None:
    """A session may start on a host that is up and runs sessions (its worker says when it
    registers why it does not: `worker.notebook.why_no_sessions`): 422 naming `host` where
    the host it names does not, `kind` where no host that is up does, or `gpu_count` where
    more GPUs than any host that does has (`gpus`: each host's, as the other checks saw them;
    the scheduler places it only there). With no host up it waits for one, as any job does."""
    refused = session_refusals(session)
    if spec.host is not None and refused.get(spec.host):
        raise SpecError("host", f"{spec.host} runs no notebook sessions: {refused[spec.host]}")
    if refused and all(refused.values()):
        said = "; ".join(f"{name}: {why}" for name, why in sorted(refused.items()))
        raise SpecError("kind", f"no host of the lab runs notebook sessions now ({said})")
    if any(refused.values()) and spec.host is None:
        sizes = {name: len(gpus[name]) for name, why in refused.items() if not why and gpus.get(name)}
        largest = max(sizes.values(), default=0)
        if (spec.gpu_count or 1) > largest:
            where = ", ".join(sorted(name for name, size in sizes.items() if size == largest)) or "none"
            raise SpecError(
                "gpu_count",
                f"{spec.gpu_count} GPUs asked for but the largest host that runs notebook sessions has {largest} "
                f"({where}; the others run none)",
            )


def check_session_time_limit(caller: Caller, limit_s: int | None, settings: Settings) -> None:
    """A member's notebook session runs at most `TOWERQ_NOTEBOOK_MAX_TIME_LIMIT_S`, asked for
    at submit or later (`PATCH /api/jobs/{id}`); admins' may run longer."""
    most = settings.notebook_max_time_limit_s
    if most and limit_s is not None and limit_s > most and not caller.is_admin:
        raise SpecError(
            "time_limit_s",
            f"a member's session runs at most {most} s (TOWERQ_NOTEBOOK_MAX_TIME_LIMIT_S): ask for less, "
            "and start a new one when it ends (your notebooks are kept)",
        )


def check_notebook(db: Database, caller: Caller, spec: JobSpec, settings: Settings, inventory: HostInventory) -> None:
    """A notebook session within the lab's caps: its idle timeout (resolved here, so the
    job shows it), the sessions a member holds, the GPUs every session holds together."""
    longest = settings.notebook_max_idle_timeout_s
    idle = spec.idle_timeout_s or min(settings.notebook_idle_timeout_s, longest)
    if idle > longest and not caller.is_admin:
        raise SpecError(
            "idle_timeout_s",
            f"{idle} s is longer than a member's session may wait idle: at most "
            f"{settings.notebook_max_idle_timeout_s} s (TOWERQ_NOTEBOOK_MAX_IDLE_TIMEOUT_S)",
        )
    spec.idle_timeout_s = idle
    if settings.notebook_max_time_limit_s and spec.time_limit_s is None:
        spec.time_limit_s = settings.notebook_max_time_limit_s
    check_session_time_limit(caller, spec.time_limit_s, settings)
    with db.read() as session:
        rows = session.execute(
            select(Job.user_id, Job.spec, Job.gpu_count).where(Job.state.in_([s.value for s in SESSION_STATES]))
        ).all()
        if settings.executor == "local":
            check_hosts_run_notebooks(session, spec, inventory.hosts())
    sessions = [row for row in rows if is_notebook(row.spec)]
    mine = sum(1 for row in sessions if row.user_id == caller.user_id)
    if mine >= settings.notebook_max_per_member:
        raise TooManyError(
            f"you have {mine} notebook sessions queued or running; at most {settings.notebook_max_per_member} "
            "at once (TOWERQ_NOTEBOOK_MAX_PER_MEMBER): end one first (towerq cancel ID)"
        )
    held = sum(row.gpu_count for row in sessions)
    cap = settings.notebook_max_gpus
    if cap and held + (spec.gpu_count or 1) > cap:
        raise TooManyError(
            f"the lab's notebook sessions hold {held} GPUs of the {cap} they may hold together "
            f"(TOWERQ_NOTEBOOK_MAX_GPUS): a session of {spec.gpu_count} GPUs waits for one to end"
        )


def check_network(caller: Caller, settings: Settings) -> None:
    """A job that asks for the network reaches what its host reaches: only with an admin's
    grant, and only where Redis and the database ask for a password."""
    if not caller.may_use_network:
        raise SpecError(
            "network",
            f"{caller.name} may not give jobs the network: it is an admin's grant "
            f'(PATCH /api/users/{caller.name} {{"may_use_network": true}})',
        )
    for setting, url in (("TOWERQ_REDIS_URL", settings.redis_url), ("TOWERQ_DATABASE_URL", settings.database_url)):
        if not url.startswith("sqlite") and not make_url(url).password:
            raise SpecError(
                "network",
                f"{setting} has no password: a job with the network would reach it. An admin must give it one first",
            )


def new_job(caller: Caller, spec: JobSpec, host: str | None, settings: Settings, key: str | None) -> dict[str, Any]:
    """The row of a job as submitted."""
    now = utcnow()
    return dict(
        name=spec.name,
        user_id=caller.user_id,
        state=JobState.QUEUED.value,
        spec=spec.stored(),
        spec_version=SPEC_VERSION,
        priority=spec.priority.value,
        gpu_count=spec.gpu_count,
        min_gpu_count=spec.min_gpu_count if spec.min_gpu_count != spec.gpu_count else None,
        gpu_memory_fraction=spec.gpu_memory_fraction,
        requested_host=host,
        requested_gpus=spec.gpus,
        group=spec.group,
        time_limit_s=spec.time_limit_s,
        total_steps=None if spec.is_command or spec.is_notebook else spec.hyperparameters.steps,
        max_attempts=spec.max_attempts or settings.max_attempts,
        idempotency_key=key,
        attempts=1,
        crashes=0,
        created_at=now,
        updated_at=now,
        on_hold_by=caller.name if spec.hold else None,
        on_hold_at=now if spec.hold else None,
        held_s=deferred_s(now, spec.begin_at),  # the time before its begin is no wait
        wait_held_s=deferred_s(now, spec.begin_at),
        begin_at=spec.begin_at,
    )
