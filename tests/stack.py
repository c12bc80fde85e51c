"""A whole towerq stack of real processes for end-to-end tests: `towerq api`, `towerq
scheduler` and `towerq worker`s, all pointed at the test's database, Redis and folders."""

from __future__ import annotations

import importlib.util
import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from service.core.lifetime import dies_with_this_process
from service.core.settings import Settings
from worker.mountinfo import beneath
from worker.processes import pid_alive

REPO = Path(__file__).resolve().parents[1]


def load_script(name: str) -> ModuleType:
    """A script of `scripts/` (a file a person runs, not a package) as a module."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py").replace("-", "_"), REPO / "scripts" / name)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


FINAL = ("succeeded", "failed", "cancelled")


def settings_env(settings: Settings, **overrides: object) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in {**settings.model_dump(), **overrides}.items():
        key = f"TOWERQ_{name.upper()}"
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONUNBUFFERED"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def unmount_beneath(root: Path) -> list[str]:
    """Unmount (lazily) what is mounted beneath `root`, deepest first: the job folders' disk
    images (`worker.disk`) a test's SIGKILLed worker left mounted (its next start would
    bring them back). What it unmounted."""
    points = [str(point) for point in beneath(root)]
    for point in points:
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    return points


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


STRETCH_MAX = 3.0
"""The most a wait is stretched for the machine's load (`load_stretch`)."""


def load_stretch() -> float:
    """How much longer than its timeout a wait may take now: the machine's load average per
    core, between 1 and `STRETCH_MAX`. The suite runs two test processes, each with a stack,
    on two cores (load 3-5 on a quiet machine); beside other work a cold TensorFlow start
    takes three times as long, and a wait sized for a quiet machine failed there (issue 50's
    busy run). A wait still ends: what never comes fails, later."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(STRETCH_MAX, max(1.0, per_core))


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    stretch = load_stretch()
    deadline = time.monotonic() + timeout * stretch
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s (x{stretch:.1f}, the machine's load) waiting for {what}")
        time.sleep(interval)


def log_messages(client: httpx.Client, job_id: int) -> list[str]:
    """The job's log as the API gives it, its lines' messages in order (the last 5,000)."""
    return [line["message"] for line in client.get(f"/api/jobs/{job_id}/logs", params={"tail": 5000}).json()]


def finished(client: httpx.Client, job_id: int, timeout: float = 180) -> dict[str, Any]:
    """The job once it has ended, as the API shows it."""
    return wait_for(
        lambda: (j := client.get(f"/api/jobs/{job_id}").json())["state"] in FINAL and j, timeout, f"job {job_id}", 0.2
    )


LOOP = """
import time
import towerq

step = 0
while True:
    step += 1
    towerq.report(step=step, loss=1.0 / step)
    time.sleep(0.2)
"""
"""A command job's program that reports a step every 0.2 s until it is stopped."""


def upload_code(client: httpx.Client, files: dict[str, str]) -> str:
    """A code bundle of `files` (name: text), uploaded; its id."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    response = client.post("/api/code", files={"file": ("code.tar.gz", packed.getvalue())})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def program_run(
    client: httpx.Client, files: dict[str, str], command: list[str], **spec: Any
) -> tuple[dict[str, Any], list[str]]:
    """`command` over `files` (its code) as a command job, with the rest of its `spec`, to its
    end: the job as the API shows it, and its log's messages."""
    code = upload_code(client, files)
    created = client.post("/api/jobs", json={"command": command, "code": code, **spec})
    assert created.status_code == 201, created.text
    job = finished(client, created.json()["id"])
    return job, log_messages(client, job["id"])


def ends_with_its_killed_starter(script: str, *args: str, what: str, env: dict[str, str] | None = None) -> list[str]:
    """Run `script` (`python -c`) as a holder that starts something and prints its pid first on
    its first line; SIGKILL the holder, as a pytest worker killed outright (which runs no
    teardown), and wait for that pid to end. The line's fields."""
    holder = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=dies_with_this_process(),
    )
    assert holder.stdout is not None
    try:
        fields = holder.stdout.readline().split()
        assert fields and fields[0].isdigit(), f"{what} did not start: {fields}"
        started = int(fields[0])
        assert pid_alive(started)
        holder.kill()
        holder.wait()
        wait_for(lambda: not pid_alive(started), 60, f"{what} to end with the process that started it")
        return fields
    finally:
        holder.kill()
        holder.wait()


class Stack:
    """Processes started for one test; `stop()` ends them all (and prints their logs when
    the test failed, through the `logs` mapping)."""

    def __init__(self, settings: Settings, workdir: Path) -> None:
        self.settings = settings
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.api_url: str | None = None

    def spawn(self, name: str, *args: str, cwd: Path = REPO, **env_overrides: object) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{name}.log"
        self.logs[name] = log
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", *args],
            cwd=cwd,
            env=settings_env(self.settings, **env_overrides),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            preexec_fn=dies_with_this_process(signal.SIGTERM),  # a killed pytest worker runs no teardown
        )
        self.processes[name] = process
        return process

    def start_api(self, **env: object) -> str:
        port = free_port()
        self.spawn("api", "api", "--port", str(port), cwd=REPO, **env)
        self.api_url = f"http://127.0.0.1:{port}"
        wait_for(self._healthy, 30, "the API to answer")
        return self.api_url

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_scheduler(self, **env: object) -> None:
        self.spawn("scheduler", "scheduler", cwd=REPO, **env)

    def start_worker(
        self, name: str = "lab-a", gpus: int = 4, cwd: Path = REPO, **env: object
    ) -> subprocess.Popen[bytes]:
        """A worker, started in `cwd` (as `towerq up` in a lab's folder would be)."""
        return self.spawn(f"worker-{name}", "worker", "--name", name, cwd=cwd, simulated_gpus=gpus, **env)

    def sandboxed_lab(self, token: str, gpus: int = 1) -> httpx.Client:
        """The API, a scheduler and one worker (lab-a, `gpus` simulated GPUs) that runs every
        attempt in bubblewrap with no warm trainer: a command job's lab. A client as `token`'s
        user, once the worker registered its GPUs."""
        self.start_api()
        self.start_scheduler()
        self.start_worker("lab-a", gpus, sandbox="bwrap", trainer_pool=0)
        client = self.client(token)
        wait_for(lambda: client.get("/api/gpus").json(), 60, "the worker to register its GPUs")
        return client

    def client(self, token: str) -> httpx.Client:
        assert self.api_url is not None
        return httpx.Client(base_url=self.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> int | None:
        process = self.processes.pop(name, None)
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(sig)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name)

    def dump_logs(self) -> str:
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"----- {name} -----\n{text[-6000:]}")
        return "\n".join(parts)
