"""Why a job waits, in words: the `pending_reason` users read in the API and dashboard."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from service.scheduler.types import Reason, Wait
from towerq.contract.times import span_text


def clock(t: float, now: float) -> str:
    """A time as `14:05`, or `Tue 14:05` when it is not within the next day."""
    moment = datetime.fromtimestamp(t).astimezone()
    if t - now < 20 * 3600:
        return moment.strftime("%H:%M")
    return moment.strftime("%a %d %b %H:%M")


def gpu_list(indices: Sequence[int]) -> str:
    label = "GPU" if len(indices) == 1 else "GPUs"
    return f"{label} {', '.join(str(i) for i in indices)}"


def gpus_phrase(count: int, fraction: float) -> str:
    noun = "GPU" if count == 1 else "GPUs"
    if fraction >= 1:
        return f"{count} free {noun}"
    return f"{count} {noun} with {fraction:g} free"


def _when(start: float, now: float) -> str:
    return f"~{clock(start, now)}" if math.isfinite(start) else "an unknown time"


def _held(holders: Sequence[int], start: float, now: float) -> str:
    held = ", ".join(f"job {j}" for j in holders) if holders else "another job"
    return held + (f", ends {_when(start, now)}" if math.isfinite(start) else "")


def describe(reason: Reason, now: float) -> str:
    """The sentence for `reason`, and for the blocker beside it (`Reason.also`)."""
    said = _describe_one(reason, now)
    return f"{said}; and {_describe_one(reason.also, now)}" if reason.also is not None else said


def _describe_one(reason: Reason, now: float) -> str:
    a = reason.args
    match reason.kind:
        case Wait.GPUS_BUSY:
            host, indices, holders, start = a
            return f"waiting for {gpu_list(indices)} on {host} ({_held(holders, start, now)})"
        case Wait.JOBS_HOLD:
            host, count, fraction, holders, start = a
            return f"waiting for {gpus_phrase(count, fraction)} on {host} ({_held(holders, start, now)})"
        case Wait.NO_FIT:
            if not a:
                return "no host has enough free GPUs"
            count, fraction, start = a
            suffix = f"; reserved from {_when(start, now)}" if math.isfinite(start) else ""
            return f"no host has {gpus_phrase(count, fraction)}{suffix}"
        case Wait.HOST_DOWN:
            return f"host {a[0]} is down or not registered"
        case Wait.NO_HOST:
            return "no host that may run it is up (a notebook session runs where its worker runs sessions)"
        case Wait.GPU_UNUSABLE:
            return f"{gpu_list(a[1])} on {a[0]} drained or absent"
        case Wait.USER_LIMIT:
            user, used, limit = a
            return f"user limit: {user} uses {used:g} of {limit:g} GPUs"
        case Wait.GROUP_LIMIT:
            group, used, limit = a
            return f"group quota: {group} uses {used:g} of its {limit:g} GPUs"
        case Wait.GROUP_HOURS:
            group, used, quota = a
            return f"group quota: {group} used {used:,.1f} of its {quota:g} GPU hours in the last 7 days"
        case Wait.LAB_RESERVED:
            host, indices, group, start, end, reservation = a
            if start <= now:
                return f"{gpu_list(indices)} on {host} reserved for group {group} until {clock(end, now)}"
            before = int(start - now) // 60 * 60  # whole minutes: the reason is read a little later
            hint = f": set time_limit_s ≤ {before} ({span_text(before)}) to run before it" if before >= 60 else ""
            return (
                f"{gpu_list(indices)} on {host} reserved for group {group} from {clock(start, now)} "
                f"to {clock(end, now)} (reservation {reservation}){hint}"
            )
        case Wait.BEHIND:
            return f"behind job {a[0]} (strict FIFO)"
        case Wait.RESERVED:
            host, indices, job_id, start = a
            if start <= now:  # held from now on: for a job elastic jobs resize for (`settle.hold_made_room`)
                return f"{gpu_list(indices)} on {host} held for job {job_id}, next to start there"
            return f"{gpu_list(indices)} on {host} reserved for job {job_id} from {_when(start, now)}"
        case Wait.PREEMPTING | Wait.SLICING:
            host, job_ids = a
            jobs = ", ".join(f"job {j}" for j in job_ids)
            if reason.kind == Wait.PREEMPTING:
                return f"stopping lower-priority {jobs} on {host} to make room"
            return f"stopping {jobs} on {host} (had their time slice) to make room"
        case Wait.SHRINKING:
            host, job_ids = a
            jobs = ", ".join(f"job {j}" for j in job_ids)
            return f"shrinking elastic {jobs} on {host} to make room (each restarts from its checkpoint on fewer GPUs)"
        case Wait.MOVING:
            hosts, job_ids = a
            jobs = ", ".join(f"job {j}" for j in job_ids)
            return f"moving elastic {jobs} off {hosts} to make room (each restarts from its checkpoint on another host)"
    return str(reason.kind)


def describe_reserved(reason_text: str, start: float | None, now: float) -> str:
    """Append the reservation a head job holds to its reason."""
    if start is None:
        return reason_text
    return f"{reason_text}; reserved from {_when(start, now)}"
