"""The attempt protocol over HTTP (`towerq.contract.attempts`): how an executor's remote side,
a Slurm node's batch script, supervises its attempt without any database or Redis
credential. Each request carries the attempt's own token (`Authorization: Bearer tqa_...`,
minted when the attempt is handed to the executor), valid for that one attempt of that one
job until the attempt ends; every write is fenced by the attempt, as in a host's worker."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from service.api.deps import ContextDep, ExecutorDep
from service.core.attempts import (
    LocalChannel,
    attempt_status,
    check_attempt_token,
    claim_attempt,
    close_door,
    drain_held,
    end_attempt,
    forget_after,
    open_door,
    sweep_rungs,
    waiting_to_start,
    write_report,
)
from service.core.context import Context
from service.core.exceptions import NotReadyError, SpecError, StaleAttemptError
from service.core.models import Job, JobState
from service.executors import ExecutorError
from towerq.contract import messages
from towerq.contract.attempts import (
    REPORT_ROWS,
    AttemptEnd,
    Claim,
    ClaimIn,
    DoorIn,
    EndIn,
    LogRow,
    MetricRow,
    Report,
    ReportIn,
    RungsOut,
    RunningIn,
    StatusOut,
)
from towerq.contract.events import Step

router = APIRouter(prefix="/api/attempts/{job_id}/{attempt}", tags=["attempts"])

Id = Annotated[int, Path(ge=1, le=2**31 - 1)]


class Attempt(BaseModel):
    job_id: int
    attempt: int


def the_attempt(request: Request, ctx: ContextDep, job_id: Id, attempt: Id) -> Attempt:
    """The attempt the request's token is for (401 for any other, and once it ended)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    with ctx.db.read() as session:
        check_attempt_token(session, job_id, attempt, token.strip() if scheme.lower() == "bearer" else None)
    return Attempt(job_id=job_id, attempt=attempt)


AttemptDep = Annotated[Attempt, Depends(the_attempt)]


class StoredOut(BaseModel):
    log_bytes: int
    metric_points: int


class PublishIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[Annotated[str, Field(max_length=64_000)]] = Field(max_length=REPORT_ROWS)


class ForgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: Step


class DrainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = Field(max_length=128)
    indices: list[Annotated[int, Field(ge=0, le=1024)]] = Field(max_length=1024)


class DrainedOut(BaseModel):
    drained: list[int]


@router.get("", response_model=StatusOut)
def status(ctx: ContextDep, it: AttemptDep) -> StatusOut:
    """Whether the attempt is still the job's current one, the stop asked of it, if any, and
    the job's time limit now."""
    with ctx.db.read() as session:
        said = attempt_status(session, it.job_id, it.attempt, idle_stop_s=ctx.settings.gpu_idle_stop_s)
    return StatusOut.model_validate(dataclasses.asdict(said))


@router.post("/claim", response_model=Claim)
def claim(body: ClaimIn, ctx: ContextDep, executor: ExecutorDep, it: AttemptDep) -> Claim:
    """The attempt started on `node`, its cluster's choice: what it runs (409 if it is not
    waiting to start). Taken only of the node the executor's cluster says runs the attempt
    (Slurm: `squeue`'s): 422 naming `node` for any other, or while the cluster does not run
    it; 503 while the cluster cannot be asked (try again)."""
    with ctx.db.read() as session:
        waiting_to_start(session, it.job_id, it.attempt)
    try:
        node = executor.runs_on(it.job_id, it.attempt, body.node)
    except ExecutorError as err:
        if err.lasting:
            raise SpecError("node", f"{executor.name.capitalize()} does not run the attempt: {err}") from err
        raise NotReadyError(f"{executor.name.capitalize()} cannot be asked where the attempt runs: {err}") from err
    if node is not None and node != body.node:
        raise SpecError("node", f"{executor.name.capitalize()} runs the attempt on {node}, not on {body.node}")
    with ctx.db.write() as session:
        return claim_attempt(session, it.job_id, it.attempt, body.node, ctx.settings.artifacts_dir)


@router.post("/running", status_code=204)
def running(body: RunningIn, ctx: ContextDep, it: AttemptDep) -> Response:
    """The attempt's process started (409 if the attempt is not waiting to start; the same
    word again, a resend after a lost answer, is taken)."""
    with ctx.db.write() as session:
        job = session.get(Job, it.job_id)
        if job is not None and job.state == JobState.RUNNING and job.pid == body.pid:
            return Response(status_code=204)
    LocalChannel(ctx, it.job_id, it.attempt).running(body.pid, body.cuda_visible_devices, body.artifacts_dir)
    return Response(status_code=204)


@router.get("/stored", response_model=StoredOut)
def stored(ctx: ContextDep, it: AttemptDep) -> StoredOut:
    """What the job's log and metric points took so far, every attempt together."""
    said = LocalChannel(ctx, it.job_id, it.attempt).stored()
    return StoredOut(log_bytes=said.log_bytes, metric_points=said.metric_points)


@router.get("/rungs", response_model=RungsOut)
def rungs(ctx: ContextDep, it: AttemptDep) -> RungsOut:
    """The rungs of the job's adaptive sweep (none outside one)."""
    with ctx.db.read() as session:
        split, steps = sweep_rungs(session, it.job_id)
    return RungsOut(split=split, steps=steps)


@router.post("/reports", status_code=204)
def report(body: ReportIn, ctx: ContextDep, it: AttemptDep) -> Response:
    """A batch of the attempt's points and log lines, and the job's figures they change
    (409 once the job moved on from the attempt)."""
    if any(point.attempt > it.attempt for point in body.metrics):
        raise SpecError("metrics.attempt", f"a point of attempt {it.attempt} comes from it or an earlier attempt")
    metrics = [MetricRow(job_id=it.job_id, **point.model_dump()) for point in body.metrics]  # type: ignore[typeddict-item]
    logs = [LogRow(job_id=it.job_id, attempt=it.attempt, **line.model_dump()) for line in body.logs]  # type: ignore[typeddict-item]
    fields = body.fields.model_dump(exclude_unset=True)
    batch = Report(metrics, logs, fields, body.log_bytes, last_words=body.last_words, held=body.held, rung=body.rung)
    with ctx.db.write() as session:
        write_report(session, it.job_id, it.attempt, batch, body.number, idle_warn_s=ctx.settings.gpu_idle_warn_s)
    return Response(status_code=204)


@router.post("/publish", status_code=204)
def publish(body: PublishIn, ctx: ContextDep, it: AttemptDep) -> Response:
    """Live copies of the attempt's points and log lines for the charts: each one a
    `metric`, `eval` or `log` message of this job and attempt, else 422 and none is sent."""
    for i, payload in enumerate(body.messages):
        try:
            message = messages.decode(payload)
        except messages.MessageError as err:
            raise SpecError(f"messages.{i}", str(err)) from None
        if not isinstance(message, messages.MetricMessage | messages.LogMessage):
            raise SpecError(f"messages.{i}", "only metric, eval and log messages are an attempt's to send")
        if (message.job_id, message.attempt) != (it.job_id, it.attempt):
            raise SpecError(f"messages.{i}", f"a message of job {it.job_id} attempt {it.attempt} only")
    _current_or_stale(ctx, it)
    LocalChannel(ctx, it.job_id, it.attempt).publish(body.messages)
    return Response(status_code=204)


@router.post("/forget", status_code=204)
def forget(body: ForgetIn, ctx: ContextDep, it: AttemptDep) -> Response:
    """Delete the job's points after `step`: the resumed attempt trains them again."""
    with ctx.db.write() as session:
        forget_after(session, it.job_id, it.attempt, body.step)
    return Response(status_code=204)


@router.post("/end", status_code=204)
def end(body: EndIn, ctx: ContextDep, it: AttemptDep) -> Response:
    """The attempt's end: the job's final state, or queued again. Its token ends with it."""
    with ctx.db.write() as session:
        end_attempt(
            session, it.job_id, it.attempt, AttemptEnd(**body.model_dump()), idle_stop_s=ctx.settings.gpu_idle_stop_s
        )
    return Response(status_code=204)


@router.post("/drain", response_model=DrainedOut)
def drain(body: DrainIn, ctx: ContextDep, it: AttemptDep) -> DrainedOut:
    """No new work on these GPUs of `host`, which a process of the attempt still holds:
    only GPUs the attempt was given are drained (those it names besides are not)."""
    with ctx.db.write() as session:
        drained = drain_held(session, it.job_id, it.attempt, body.host, body.indices)
    return DrainedOut(drained=drained)


@router.post("/door", status_code=204)
def door(body: DoorIn, ctx: ContextDep, executor: ExecutorDep, it: AttemptDep) -> Response:
    """A notebook session's door: where the API's proxy reaches it, and the secret it proves.
    Only on the node the attempt claimed and on a port of `TOWERQ_RANK_PORTS` (422 naming
    `address` otherwise): an attempt's token points the API's proxy at a rank port of its
    node only, never at another service. The proxy reaches the node where its cluster says
    (Slurm: its `NodeAddr`); 503 while the cluster cannot be asked (try again)."""
    host, _, port = body.address.rpartition(":")
    low, high = ctx.settings.rank_port_range
    with ctx.db.read() as session:
        job = session.get(Job, it.job_id)
        node = job.host_name if job is not None else None
    if node is None or host != node:
        raise SpecError("address", f"the door is on the node the attempt runs on ({node}), not on {host}")
    if not low <= int(port) <= high:
        raise SpecError("address", f"the door's port is one of TOWERQ_RANK_PORTS ({low}-{high}), not {port}")
    try:
        reached = executor.reach(node)
    except ExecutorError as err:
        raise NotReadyError(f"{executor.name.capitalize()} cannot be asked where {node} is reached: {err}") from err
    with ctx.db.write() as session:
        open_door(session, it.job_id, it.attempt, f"{reached}:{port}", body.key)
    return Response(status_code=204)


@router.delete("/door", status_code=204)
def shut_door(ctx: ContextDep, it: AttemptDep) -> Response:
    """The session's door is shut: its address and secret are forgotten."""
    with ctx.db.write() as session:
        close_door(session, it.job_id, it.attempt)
    return Response(status_code=204)


def _current_or_stale(ctx: Context, it: Attempt) -> None:
    with ctx.db.read() as session:
        if not attempt_status(session, it.job_id, it.attempt, idle_stop_s=0).current:
            raise StaleAttemptError(f"job {it.job_id} attempt {it.attempt} is over")
