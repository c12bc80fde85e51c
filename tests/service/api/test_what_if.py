"""What if (SQLite and PostgreSQL): the lab's own ended jobs replayed on the lab as it is
and with other settings, side by side, over the API (admins) and from the command line
(`towerq simulate --from-db`, and `--export` to a trace file the simulator reads back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from service.core.db import Database
from service.core.models import Job, JobState, utcnow
from service.core.settings import Settings
from service.scheduler.trace import read_trace
from tests.service.api.conftest import Api
from tests.service.api.test_usage import add_run, lab_user_queued


def three_hour_long_jobs_on_one_gpu(db: Database) -> None:
    """Three one-hour jobs submitted together on a one-GPU lab: they ran one after another."""
    start = utcnow() - timedelta(hours=10)
    for n, user in enumerate(("alice", "bob", "carol")):
        began = start + timedelta(hours=n)
        add_run(db, user, "solo", [0], start, began, began + timedelta(hours=1), group="vision" if n else None)
    lab_user_queued(db, "dave")  # never ran: left out


def test_what_if_replays_the_labs_jobs_as_it_is_and_with_more_gpus(
    as_user: Callable[..., Api], add_host: Callable[..., None], db: Database, set_job: Callable[..., None]
) -> None:
    add_host("solo", 1)
    three_hour_long_jobs_on_one_gpu(db)
    with db.read() as session:
        waiting = session.scalars(select(Job.id).where(Job.state == JobState.QUEUED)).one()
    set_job(waiting, state=JobState.CANCELLED)
    admin = as_user("root", admin=True)
    assert as_user("alice").post("/api/usage/what-if", json={}).status_code == 403
    answer = admin.post("/api/usage/what-if", json={"hosts": 3, "time_slice_gpu_s": 0})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["jobs"], body["never_ran"]) == (3, 1)
    now, other = body["now"], body["what_if"]
    assert (now["setup"]["hosts"], now["setup"]["gpus_per_host"]) == (1, 1)
    assert (other["setup"]["hosts"], other["setup"]["time_slice_gpu_s"]) == (3, 0)
    assert now["max_wait_s"] == 7200.0 and other["max_wait_s"] == 0.0  # one after another, or all at once
    assert now["avg_jct_s"] == 7200.0 and other["avg_jct_s"] == 3600.0
    assert now["user_avg_jct_s"] == 7200.0 and other["user_avg_jct_s"] == 3600.0  # one job each
    assert now["per_user"]["alice"]["gpu_hours"] == 1.0 and now["gpu_hours"] == 3.0
    assert now["per_group"]["vision"]["gpus_while_waiting"] < now["per_group"]["vision"]["entitled_while_waiting"]

    long_ago = (utcnow() - timedelta(days=200)).isoformat()
    too_long = admin.post("/api/usage/what-if", json={"since": long_ago})
    assert too_long.status_code == 422 and "since" in too_long.text
    assert admin.post("/api/usage/what-if", json={"hosts": 0}).status_code == 422
    assert admin.post("/api/usage/what-if", json={"slice": 0}).status_code == 422


def test_towerq_simulate_from_db_replays_and_exports_the_labs_jobs(
    settings: Settings, add_host: Callable[..., None], db: Database, tmp_path: Path
) -> None:
    add_host("solo", 1)
    three_hour_long_jobs_on_one_gpu(db)
    env = {**os.environ, "TOWERQ_DATABASE_URL": settings.database_url}
    command = [sys.executable, "-m", "service.cli", "simulate", "--from-db", "--since", "1d"]
    out = subprocess.run([*command, "--gpus-per-host", "3", "-o", "json"], capture_output=True, text=True, env=env,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["now"]["max_wait_s"] == 7200.0 and body["what_if"]["max_wait_s"] == 0.0
    # For people, the What-if page's table: the lab as now beside the options given, per user too.
    table = subprocess.run([*command, "--gpus-per-host", "3"], capture_output=True, text=True, env=env, timeout=120)
    lines = table.stdout.splitlines()
    assert lines[0] == "3 jobs, 3.0 GPU-hours of work", table.stdout
    assert lines[1] == "  as now:  1 x 1 GPUs, towerq, slice 1 GPU-h" and lines[2].startswith("  what if: 1 x 3 GPUs")
    max_wait = next(line for line in lines if line.startswith("max wait")).split()
    assert max_wait == ["max", "wait", "2h00m", "0m00s", "0.00x"]
    per_user = next(line for line in lines if line.startswith("avg, each user once")).split()[-3:]
    assert per_user == ["2h00m", "1h00m", "0.50x"]
    users = lines[lines.index(next(line for line in lines if line.startswith("USER"))) + 1 :]
    assert {line.split()[0] for line in users} == {"alice", "bob", "carol"}
    trace = tmp_path / "lab.csv"
    exported = subprocess.run([*command, "--export", str(trace)], capture_output=True, text=True, env=env, timeout=120)
    assert exported.returncode == 0 and "3 jobs written" in exported.stdout, exported.stderr
    jobs = read_trace(trace)
    assert [(j.user, j.duration, j.gpu_count, j.group) for j in jobs] == [
        ("alice", 3600.0, 1, None), ("bob", 3600.0, 1, "vision"), ("carol", 3600.0, 1, "vision"),
    ]  # fmt: skip
    bad = subprocess.run([*command, "--until", "2d"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "--since must be before --until" in bad.stderr
