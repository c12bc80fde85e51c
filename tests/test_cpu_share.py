"""When a host's CPUs are contended, attempts share them in proportion to their GPUs (the
CPU weight of each attempt's cgroup, worker/cgroups.py): two command jobs on one worker,
one on 3 GPUs and one on 1, each running several busy processes on the same CPU, get
about 3:1 of its time while both run. Before, every trainer process weighed the same
(its niceness), so the 1-GPU job's many processes took as much as its 3-GPU neighbour.

Both jobs' processes keep to one CPU: the weights share each CPU by them, and with the
jobs spread over two CPUs beside a neighbouring test's busy process, where the scheduler
put which job's processes decided their shares as much as the weights did (a full run
once measured 1.7:1)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pytest

from service.core.settings import Settings
from tests.stack import Stack, finished, upload_code, wait_for
from worker.cgroups import hierarchies

pytestmark = pytest.mark.slow

BURN = """
import os, sys, time

busy, until, cpu = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {cpu})
for _ in range(busy):
    if os.fork() == 0:
        said = 0.0
        while (now := time.time()) < until:
            for _ in range(20000):
                pass
            if now >= said + 0.5:
                print("CPU", os.getpid(), repr(now), repr(time.process_time()), flush=True)
                said = now
        os._exit(0)
for _ in range(busy):
    os.wait()
"""


READING = re.compile(r"CPU \d+ [\d.]+ [\d.]+$")


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    if not any(h.controller in ("", "cpu") for h in hierarchies()):
        pytest.skip("no writable cgroup hierarchy here: attempts run without a CPU weight (said in the job's log)")
    return make_settings(sqlite_url)


def cpu_in(lines: list[str], start: float, end: float) -> float:
    """CPU seconds the job's busy processes used between `start` and `end` (wall clock),
    from each one's readings: (time, its CPU time so far)."""
    readings: dict[str, list[tuple[float, float]]] = {}
    for line in lines:
        if line.startswith("CPU "):
            _, pid, wall, cpu = line.split()
            readings.setdefault(pid, []).append((float(wall), float(cpu)))
    total = 0.0
    for points in readings.values():
        inside = [cpu for wall, cpu in points if start <= wall <= end]
        total += inside[-1] - inside[0] if len(inside) > 1 else 0.0
    return total


def test_contended_cpus_go_to_attempts_in_proportion_to_their_gpus(
    stack: Stack, settings: Settings, make_token: Callable[..., str]
) -> None:
    stack.start_api()
    stack.start_scheduler()
    stack.start_worker("lab-a", 4, trainer_pool=0)
    client = stack.client(make_token("alice"))
    wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    code = upload_code(client, {"burn.py": BURN})
    busy, cpu = 4, min(os.sched_getaffinity(0))  # each job alone would fill the CPU
    until = time.time() + 15
    ids = {}
    for gpus in (3, 1):
        command = ["python", "burn.py", str(busy), repr(until), str(cpu)]
        spec = {"command": command, "code": code, "gpu_count": gpus}
        created = client.post("/api/jobs", json=spec)
        assert created.status_code == 201, created.text
        ids[gpus] = created.json()["id"]
    logs = {}
    for gpus, job_id in ids.items():
        job = finished(client, job_id, timeout=90)
        assert job["state"] == "succeeded", job
        text = client.get(f"/api/jobs/{job_id}/logs.txt").text  # every line (a reading each half second)
        logs[gpus] = [(m.group(0) if (m := READING.search(line)) else line) for line in text.splitlines()]
    told = next(m for m in logs[1] if "limits:" in m)
    if "not enforced here: CPU weight" in told:
        pytest.skip(f"this host's cgroups give no CPU weight: {told}")
    one = round(1024 * 1.25**-settings.trainer_nice)  # a niced process's weight, a GPU (110 at nice 10)
    assert f"CPU weight {one} (" in told and f"CPU weight {3 * one} (" in next(m for m in logs[3] if "limits:" in m)

    def span(lines: list[str]) -> tuple[float, float]:
        walls = [float(m.split()[2]) for m in lines if m.startswith("CPU ")]
        return min(walls), max(walls)

    (a0, a1), (b0, b1) = span(logs[3]), span(logs[1])
    start, end = max(a0, b0) + 1, min(a1, b1) - 1  # both running, their processes all started
    assert end - start > 6, (a0, a1, b0, b1)
    big, small = cpu_in(logs[3], start, end), cpu_in(logs[1], start, end)
    assert big > 1.8 * small, f"3 GPUs got {big:.1f} CPU s, 1 GPU {small:.1f} CPU s in {end - start:.0f} s"
