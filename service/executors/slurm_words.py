"""What Slurm's commands say, read (`squeue` and `sinfo` in formats of towerq's, fields
apart by an unprintable separator: job names and reasons are free text), and what it says
of a job in a member's words: why it waits, when Slurm expects it to start, and how the
cluster ended it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from service.executors.base import Ended
from service.executors.slurm_cpus import NodeRow

SEP = "\x1f"
"""Between squeue's fields: job names and reasons are free text."""
HELD_STATES = frozenset(
    {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
        "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "STOPPED",
    }
)  # fmt: skip
REASONS = {
    "Resources": "the GPUs it asks for are in use",
    "Priority": "jobs of higher priority wait before it",
    "Dependency": "it waits for another Slurm job",
    "QOSMaxGRESPerUser": "the QOS's GPU limit per user is reached",
    "AssocGrpGRES": "the account's GPU limit is reached",
    "PartitionTimeLimit": "its time limit is over the partition's",
    "ReqNodeNotAvail": "the node it asks for is unavailable",
    "BeginTime": "it may not start yet",
    "JobHeldAdmin": "an admin holds it",
    "JobHeldUser": "it is held",
    "NodeDown": "a node it needs is down",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
}
"""Slurm's common pending reasons in a user's words (Slurm's own code is kept beside them)."""
PENDING_NOW = {"None", "(null)", ""}


@dataclass(frozen=True)
class SlurmJob:
    id: int
    name: str
    state: str
    reason: str
    start: datetime | None
    node: str
    """Where it runs or ran; for a pending job, where Slurm plans to start it (if it knows)."""


def parse_time(text: str) -> datetime | None:
    """squeue's times, asked as epoch seconds (`SLURM_TIME_FORMAT=%s`); None for N/A."""
    try:
        value = int(text)
    except ValueError:
        return None
    return datetime.fromtimestamp(value, UTC) if value > 0 else None


def parse_gpus(gres: str) -> int:
    """GPUs in a node's gres (`gpu:4`, `gpu:a100:2(S:0-1),gpu:v100:2`, `(null)`)."""
    total = 0
    for part in re.split(r",(?![^(]*\))", gres):
        fields = re.sub(r"\(.*\)$", "", part.strip()).split(":")
        if fields[0] == "gpu" and len(fields) >= 2 and fields[-1].isdigit():
            total += int(fields[-1])
    return total


SINFO_FORMAT = SEP.join(("%N", "%P", "%G", "%t", "%c"))
"""Node, partition (the default one marked `*`), gres, state, CPUs: a line per node and partition."""
DOWN = ("down", "drain", "drng", "fail", "futr")


def parse_nodes(out: str) -> list[NodeRow]:
    """`sinfo --Node --format=SINFO_FORMAT`'s lines; a line of another shape is skipped."""
    rows = []
    for line in out.splitlines():
        fields = line.split(SEP)
        if len(fields) != 5 or not fields[4].isdigit():
            continue
        node, partition, gres, state, cpus = fields
        default = partition.endswith("*")
        rows.append(NodeRow(node, partition.rstrip("*"), default, parse_gpus(gres), int(cpus), state))
    return rows


SQUEUE_FORMAT = SEP.join(("%i", "%T", "%S", "%N", "%Y", "%r", "%j"))
"""Id, state, (expected) start, nodes, nodes planned for a pending job, reason, name."""


def parse_squeue(out: str, prefix: str) -> dict[str, list[SlurmJob]]:
    """towerq's jobs (named `<prefix>-...`) in squeue's output, by name."""
    jobs: dict[str, list[SlurmJob]] = {}
    for line in out.splitlines():
        parts = line.split(SEP, 6)
        if len(parts) != 7 or not parts[0].isdigit() or not parts[6].startswith(f"{prefix}-"):
            continue
        node = parts[3] if parts[1] != "PENDING" else parts[4]
        job = SlurmJob(int(parts[0]), parts[6], parts[1], parts[5], parse_time(parts[2]), node_named(node))
        jobs.setdefault(job.name, []).append(job)
    return jobs


def node_named(text: str) -> str:
    return "" if text in ("(null)", "n/a", "N/A") else text


def pending_reason(job: SlurmJob) -> str | None:
    """Why a job Slurm holds has not started, in a member's words beside Slurm's code;
    None for a running one."""
    if job.state != "PENDING":
        return None if job.state == "RUNNING" else f"Slurm job {job.id} is {job.state.lower()}"
    code = job.reason
    if code in PENDING_NOW:
        return f"Slurm job {job.id} is pending: about to start"
    words = REASONS.get(code)
    said = f"{code}: {words}" if words else code
    return f"Slurm job {job.id} is pending ({said})"


def expected_start(job: SlurmJob) -> datetime | None:
    """`squeue --start`'s figure where Slurm's backfill computed one within a year."""
    if job.state != "PENDING" or job.start is None:
        return None
    if (job.start - datetime.now(UTC)).days >= 365:  # Slurm's "no idea" (a job without a time limit)
        return None
    return job.start


def ended(job: SlurmJob, log_dir: Path) -> Ended:
    """How the cluster ended a job the attempt did not record the end of, in towerq's words
    (`log_dir`: where Slurm's own output of it is)."""
    where = f" on {job.node}" if job.node else ""
    said = f"Slurm job {job.id}{where}"
    state = job.state
    if state == "CANCELLED":
        return Ended("cancelled", f"cancelled in Slurm ({said} was cancelled, e.g. by scancel)")
    if state in ("TIMEOUT", "DEADLINE"):
        return Ended("failed", f"Slurm ended it at its time limit ({said}: {state})")
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return Ended("requeue", f"its node failed ({said}: {state}); it resumes from its checkpoint")
    if state == "PREEMPTED":
        return Ended("preempted", f"Slurm preempted it ({said}); it resumes from its checkpoint")
    if state == "OUT_OF_MEMORY":
        return Ended("failed", f"Slurm killed it for using more host memory than it was given ({said})")
    if state == "COMPLETED":
        return Ended("failed", f"{said} ended without reporting an end (see {log_dir})")
    return Ended("failed", f"{said} ended {state}: {job.reason} (see {log_dir})")
