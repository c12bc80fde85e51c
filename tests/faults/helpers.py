"""What the fault tests check after the dust settles."""

from __future__ import annotations

import os
from typing import Any

import httpx

from tests.stack import wait_for

FINAL = ("succeeded", "failed", "cancelled")


def job_of(client: httpx.Client, job_id: int) -> dict[str, Any]:
    response = client.get(f"/api/jobs/{job_id}")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def wait_state(client: httpx.Client, job_id: int, states: tuple[str, ...], timeout: float = 240) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (j := job_of(client, job_id))["state"] in states and j, timeout, f"job {job_id} to be {states}", 0.3
    )


def wait_step(client: httpx.Client, job_id: int, step: int, timeout: float = 240) -> dict[str, Any]:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (j := job_of(client, job_id))["step"] is not None and j["step"] >= step and j,
        timeout,
        f"job {job_id} to reach step {step}",
        0.2,
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def trainer_pids() -> set[int]:
    """Every live `python -m worker.trainer` process on this machine."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if b"worker.trainer" in cmdline.read() and pid_alive(int(entry)):
                        found.add(int(entry))
            except OSError:
                continue
    return found


def assert_metrics_continuous(client: httpx.Client, job_id: int, every: int, total: int) -> list[dict[str, Any]]:
    """One train point per `every` steps up to `total`, none twice."""
    points = [m for m in client.get(f"/api/jobs/{job_id}/metrics").json() if m["split"] == "train"]
    steps = [m["step"] for m in points]
    assert steps == list(range(every, total + 1, every)), steps
    return points
