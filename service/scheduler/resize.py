"""Live resizes of elastic jobs: what the policy decides (`Decision.shrink`, `Decision.grow`,
`service.scheduler.elastic`) done to running attempts.

A resize is a stop at a checkpoint and a start from it on other GPUs (a model job's step
keeps its global batch on any number of towers: docs/trainer.md). The pass that decides it
asks the job's worker to stop, as preemption does, and records where its next attempt
starts (`Job.resize_to`): a shrink its own GPUs less those it gives up, a grow its own and
the idle ones it was given (or those of another host). While it stops it holds all its
GPUs, and those of the host it moves to (`snapshot` reads them as its own), and the job a
shrink makes room for waits for them (`Wait.SHRINKING`) without stopping anything else;
so does the job that needs whole hosts a move frees (`Decision.moved_for`, `Wait.MOVING`),
and the free GPUs beside what they wait for are held for them (`settle.hold_made_room`). When the
attempt has ended and the job is queued again, the next pass gives it those GPUs first,
before the policy places anyone (`settle.place_resized`), so the queue cannot take the GPUs a
job kept; the GPUs it gave up are held for the job it was resized for, with the rest. The
simulator holds the same GPUs (a resize there is a restart on the new GPUs at once), and
the idle GPUs of a growth on its own host too, which live go to a job that came while it
stopped (idle GPUs no one waited for): it starts on those still free if they are at least
its minimum, as where some were drained, and otherwise waits in the queue like any
elastic job.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.lifecycle import gpu_list, request_preemption
from service.core.models import Job, JobState
from service.scheduler.settle import Target
from service.scheduler.types import Cluster, Decision
from towerq.contract.messages import PreemptMessage


def read_targets(session: Session) -> dict[int, Target]:
    """The queued jobs a resize stopped, and where each starts next."""
    rows = session.execute(
        select(Job.id, Job.resize_to, Job.run_served_gpu_s).where(
            Job.state == JobState.QUEUED, Job.resize_to.isnot(None)
        )
    )
    return {job_id: target for job_id, record, run_served in rows if (target := Target.read(record, run_served))}


def request_resizes(session: Session, decision: Decision, cluster: Cluster) -> tuple[list[int], list[PreemptMessage]]:
    """Ask the workers of the jobs the pass shrinks or grows to stop at a checkpoint, and
    record where each starts next; (the jobs asked, the messages for the executor once
    this commits)."""
    running = {r.id: r for r in cluster.running}
    asked, stopping = [], []
    for job_id, kept in decision.shrink.items():
        was = running[job_id]
        given = {i for i in was.indices if i not in kept}
        for_job = next(
            (p.job_id for p in decision.placements for host, ids in p.slots if host == was.host and given & set(ids)),
            None,
        )
        job = session.get(Job, job_id)
        if job is None:
            continue
        whom = f"for job {for_job}" if for_job is not None else "to make room"
        reason = (
            f"shrinking to {len(kept)} of {job.gpu_count} GPUs {whom}: it restarts on "
            f"{gpu_list([str(i) for i in kept])} of {was.host} from its checkpoint"
        )
        if message := _stop(session, job, reason, Target(was.host, kept, for_job=for_job, source=was.host)):
            asked.append(job_id)
            stopping.append(message)
    for job_id, (host, indices) in decision.grow.items():
        job = session.get(Job, job_id)
        if job is None:
            continue
        where = f"{gpu_list([str(i) for i in indices])} of {host}"
        for_job = decision.moved_for.get(job_id)
        if for_job is not None:
            reason = (
                f"moving to {where} to free {running[job_id].host} for job {for_job}: it restarts there from "
                "its checkpoint on as many GPUs"
            )
        else:
            reason = (
                f"growing to {len(indices)} of {job.gpu_count} GPUs (idle ones): it restarts on {where} from "
                "its checkpoint"
            )
        if message := _stop(session, job, reason, Target(host, indices, for_job=for_job, source=running[job_id].host)):
            asked.append(job_id)
            stopping.append(message)
    return asked, stopping


def _stop(session: Session, job: Job, reason: str, target: Target) -> PreemptMessage | None:
    """Ask an elastic job to stop as preemption does (`request_preemption`: None when it
    holds no GPUs or is already stopping), recording where it restarts."""
    if job.min_gpu_count is None:
        return None
    message = request_preemption(session, job, reason)
    if message is not None:
        job.resize_to = target.record()
    return message
