"""`towerq up`, what `make run` ends in: one foreground process tree with an embedded Redis,
a login URL, 4 simulated GPUs on a host without a driver; a job runs; Ctrl+C stops every
process of the tree; a second start keeps the data and the admin token."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from service.core.lifetime import dies_with_this_process
from tests.conftest import free_port
from tests.stack import REPO, upload_code, wait_for
from worker.processes import live_members, pid_alive

pytestmark = pytest.mark.slow
FINAL = ("succeeded", "failed", "cancelled")


class Up:
    """`towerq up` in its own session, as a terminal runs it; its output read line by line."""

    def __init__(
        self,
        workdir: Path,
        port: int,
        redis_port: int,
        command: list[str] | None = None,
        pythonpath: bool = True,
        base_env: dict[str, str] | None = None,
    ) -> None:
        """`command`: how to start it (default this checkout's `python -m service.cli up`,
        with the checkout on PYTHONPATH unless `pythonpath` is false)."""
        env = {k: v for k, v in (base_env or os.environ).items() if not k.startswith("TOWERQ_")}
        var = workdir / "var"
        env.update(
            TOWERQ_VAR_DIR=str(var),
            TOWERQ_DATABASE_URL=f"sqlite:///{var / 'towerq.db'}",
            TOWERQ_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            TOWERQ_DATA_DIR=str(var / "data"),
            TOWERQ_ARTIFACTS_DIR=str(var / "artifacts"),
            TOWERQ_MODELS_PATH=str(var / "models"),
            TOWERQ_HOST_NAME="lab-up",
            TOWERQ_SCHEDULER_INTERVAL_S="0.5",
            PYTHONUNBUFFERED="1",
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        if pythonpath:
            env["PYTHONPATH"] = str(REPO)
        self.process = subprocess.Popen(
            command or [sys.executable, "-m", "service.cli", "up", "--port", str(port)],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_this_process(signal.SIGTERM),  # a killed pytest worker ends it too
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match[str]:
        compiled = re.compile(pattern)
        found: Callable[[], re.Match[str] | None] = lambda: next(  # noqa: E731
            (m for line in list(self.lines) if (m := compiled.search(line))), None
        )
        try:
            return wait_for(found, timeout, f"towerq up to print {pattern!r}", 0.2)
        except AssertionError:
            raise AssertionError(f"towerq up printed:\n{self.text()[-4000:]}") from None

    def ctrl_c(self, timeout: float = 90) -> int:
        """SIGINT to the whole foreground group, as a terminal's Ctrl+C sends it."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def processes_in_session(sid: int) -> list[str]:
    return [f"{p.pid}: {p.cmdline}" for p in live_members(sid=sid)]


def test_towerq_up_serves_runs_a_job_and_stops_every_process_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    up = Up(tmp_path, port, free_port())
    try:
        login = up.wait_for_line(r"log in:\s+(http://\S+/#token=(\S+))", 120)
        token = login.group(2)
        banner = up.text()
        assert f"dashboard and API on http://127.0.0.1:{port}" in banner
        assert "4 simulated GPUs (CPU logical devices; no NVIDIA driver) on lab-up" in banner
        assert "embedded Redis" in banner
        assert (tmp_path / "var" / "admin-token").read_text().strip() == token

        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
        assert httpx.get(login.group(1)).status_code == 200  # the dashboard behind the login link
        spec = {"model": "mlp", "dataset": "digits", "gpus": [0], "hyperparameters": {"steps": 60}}
        job_id = client.post("/api/jobs", json=spec).json()["id"]
        job = wait_for(
            lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, 180, "the job", 0.5
        )
        assert job["state"] == "succeeded", job["error"]
        assert job["allocation"]["simulated"] is True

        # A dashboard's live stream stays open: Ctrl+C ends it at once and stops without a
        # word of error (it waited for the supervisor's kill, a minute, before issue 31).
        before = len(up.lines)
        ended: list[str] = []
        with client.stream("GET", "/api/stream") as live:
            assert live.headers["content-type"].startswith("text/event-stream")
            reading = threading.Thread(target=lambda: ended.extend(live.iter_lines()), daemon=True)
            reading.start()
            started = time.monotonic()
            assert up.ctrl_c() == 0
            stopped_in = time.monotonic() - started
            reading.join(10)
        assert stopped_in < 10, f"Ctrl+C took {stopped_in:.1f} s:\n" + "\n".join(up.lines[before:])
        assert not reading.is_alive() and ": connected" in ended  # the stream ended, not cut off
        said = "\n".join(up.lines[before:])
        assert "ERROR" not in said and "Traceback" not in said, said
        assert processes_in_session(up.process.pid) == []
        assert "towerq stopped" in up.text()
    finally:
        up.kill()

    # The second start keeps the database and does not make another admin token.
    again = Up(tmp_path, port, free_port())
    try:
        relogin = again.wait_for_line(r"log in:\s+(http://\S+/#token=(\S+))", 120)  # the saved token, again
        assert relogin.group(2) == token
        assert client.get(f"/api/jobs/{job_id}").json()["state"] == "succeeded"
        assert again.ctrl_c() == 0
        assert processes_in_session(again.process.pid) == []
    finally:
        again.kill()
        client.close()

    # Killed outright, `towerq up` still takes every process it started with it.
    killed = Up(tmp_path, port, free_port())
    try:
        killed.wait_for_line(r"log in:", 120)
        os.kill(killed.process.pid, signal.SIGKILL)
        killed.process.wait()
        wait_for(lambda: not processes_in_session(killed.process.pid), 90, "towerq up's children to die with it")
    finally:
        for leftover in live_members(sid=killed.process.pid):
            os.kill(leftover.pid, signal.SIGKILL)


SLOW_TO_STOP = """
import os, signal, sys, time
import towerq

if os.environ["TOWERQ_ATTEMPT"] == "1":  # a checkpoint that takes its time
    signal.signal(signal.SIGTERM, lambda signum, frame: time.sleep(600))
step = 0
while True:
    step += 1
    towerq.report(step=step, loss=1.0 / step)
    # written whole or not at all: the SIGTERM's handler may run between an open and its write
    saved = os.path.join(os.environ["TOWERQ_OUTPUT_DIR"], "progress.txt")
    with open(saved + ".part", "w") as out:
        out.write(str(step))
    os.replace(saved + ".part", saved)
    time.sleep(0.2)
"""


def test_a_second_ctrl_c_stops_towerq_up_at_once(tmp_path: Path) -> None:
    """The first Ctrl+C stops cleanly (the worker checkpoints its jobs) and says that a second
    stops at once, as `docker compose` does; the second kills what has not stopped, trainers
    with it, and brings the job's folder back from its disk image (no mount is left behind).
    The next start puts the job back in the queue, as after a crash."""
    port = free_port()
    up = Up(tmp_path, port, free_port())
    try:
        token = up.wait_for_line(r"log in:\s+(http://\S+/#token=(\S+))", 120).group(2)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"})
        code = upload_code(client, {"slow.py": SLOW_TO_STOP})
        job_id = client.post("/api/jobs", json={"command": ["python", "slow.py"], "code": code}).json()["id"]
        job = wait_for(lambda: (j := client.get(f"/api/jobs/{job_id}").json())["step"] and j, 180, "the job", 0.5)
        trainer = int(next(e["message"] for e in job["events"] if e["state"] == "running").split()[1])

        os.killpg(up.process.pid, signal.SIGINT)
        up.wait_for_line(r"Ctrl\+C again stops at once", 30)
        time.sleep(1)  # its program is checkpointing, for ten minutes
        assert up.process.poll() is None
        started = time.monotonic()
        assert up.ctrl_c(30) == 0
        assert time.monotonic() - started < 15
        assert "worker (pid" in up.text() and "stopped at once, as asked" in up.text()
        assert processes_in_session(up.process.pid) == []
        wait_for(lambda: not pid_alive(trainer), 30, "its program to die with the worker")
        assert not mounts_under(tmp_path), "a job folder left mounted on its disk image"
        assert not list((tmp_path / "var" / "disks").glob("*.img"))
        progress = [int(p.read_text()) for p in (tmp_path / "var" / "artifacts").rglob("progress.txt")]
        assert progress and progress[0] >= job["step"]  # what it wrote on its disk image, back
    finally:
        up.kill()

    again = Up(tmp_path, port, free_port())
    try:
        again.wait_for_line(r"log in:", 120)
        job = wait_for(
            lambda: (j := client.get(f"/api/jobs/{job_id}").json())["attempts"] == 2 and j["step"] and j,
            180,
            "attempt 2",
            0.5,
        )
        assert "restarted" in next(e["message"] for e in reversed(job["events"]) if e["state"] == "queued")
        assert again.ctrl_c() == 0  # its second attempt stops at once
        assert processes_in_session(again.process.pid) == []
    finally:
        again.kill()
        client.close()
    assert not mounts_under(tmp_path)


def mounts_under(folder: Path) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(folder) in line]
