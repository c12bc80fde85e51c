"""Running one attempt of one job: the trainer process, its lines, its end.

The trainer runs as `python -m worker.trainer SPEC.json` in its own session (so its whole
process group can be signalled), with `CUDA_VISIBLE_DEVICES` set to exactly the allocated
GPUs, and it asks the kernel to kill it if this thread's process dies (PR_SET_PDEATHSIG).
A stop (cancel, time limit, preemption, worker shutdown) is SIGTERM to the group, which
the trainer answers with a checkpoint, then SIGKILL after the grace period. The GPUs are
released only once the process group is gone and the driver no longer lists the trainer.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from service import defaults
from service.context import Context
from service.exceptions import StaleAttemptError
from service.lifecycle import current_attempt, finish, mark_running, requeue
from service.models import Gpu, Host, Job, JobState
from worker.inventory import Inventory, SimulatedInventory, pid_alive
from worker.relay import MetricSink, parse_time
from worker.trainer.protocol import METRICS_LOG, read_metrics_log

log = logging.getLogger(__name__)

ZOMBIE_WAIT_S = 60.0
CHECK_EVERY_S = 1.0
REPO_ROOT = Path(__file__).resolve().parents[1]


class Stop(enum.StrEnum):
    CANCEL = "cancel"
    TIME_LIMIT = "time_limit"
    SHUTDOWN = "shutdown"
    PREEMPT = "preempt"
    STALE = "stale"


@dataclass
class Launch:
    """Everything needed to start one attempt, read from the database by the agent."""

    job_id: int
    attempt: int
    host: str
    indices: list[int]
    fraction: float
    spec: dict[str, Any]
    time_limit_s: int | None
    memory_total_mb: list[int]
    simulated: bool


@dataclass
class Outcome:
    done: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    stop: Stop | None = None
    stop_message: str | None = None
    returncode: int | None = None
    last_stderr: list[str] = field(default_factory=list)
    step: int | None = None


def read_launch(ctx: Context, job_id: int, attempt: int, host: str) -> Launch:
    """The launch of `attempt` of `job_id` on `host`, if it is still the current one."""
    with ctx.db.read() as session:
        job = session.get(Job, job_id)
        if job is None or job.attempts != attempt or job.state != JobState.DISPATCHED:
            raise StaleAttemptError(f"job {job_id} attempt {attempt} is not waiting to start")
        if job.host_name != host:
            raise StaleAttemptError(f"job {job_id} attempt {attempt} is for host {job.host_name}, not {host}")
        rows = [
            (a.gpu.index, a.gpu.memory_total_mb, a.gpu.simulated, a.fraction)
            for a in job.allocations
            if a.attempt == attempt and a.released_at is None
        ]
    rows.sort()
    return Launch(
        job_id=job_id,
        attempt=attempt,
        host=host,
        indices=[r[0] for r in rows],
        fraction=rows[0][3] if rows else 1.0,
        spec=job.spec,
        time_limit_s=job.time_limit_s,
        memory_total_mb=[r[1] for r in rows],
        simulated=all(r[2] for r in rows),
    )


class JobRunner:
    """Supervises one trainer process from start to recorded end, in its own thread."""

    def __init__(
        self,
        ctx: Context,
        inventory: Inventory,
        launch: Launch,
        on_exit: Callable[[JobRunner], None],
    ) -> None:
        self.ctx = ctx
        self.inventory = inventory
        self.launch = launch
        self.on_exit = on_exit
        self.sink = MetricSink(ctx, launch.job_id, launch.attempt)
        self.outcome = Outcome()
        self.process: subprocess.Popen[bytes] | None = None
        self._stop_requested = threading.Event()
        self._stop_deadline: float | None = None
        self.artifacts = ctx.settings.artifacts_dir.resolve() / f"job-{launch.job_id}"
        self.thread = threading.Thread(target=self.run, name=f"job-{launch.job_id}-{launch.attempt}", daemon=True)

    @property
    def key(self) -> tuple[int, int]:
        return (self.launch.job_id, self.launch.attempt)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def request_stop(self, reason: Stop, message: str) -> None:
        """Ask the trainer to checkpoint and stop (SIGTERM now, SIGKILL after the grace)."""
        if self.outcome.stop is None:
            self.outcome.stop = reason
            self.outcome.stop_message = message
        self._stop_requested.set()

    # -- the thread -----------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self._start():
                self._supervise()
            self._end()
        except Exception:
            log.exception("runner for job %s attempt %s failed", *self.key)
            self._kill_group()
            self._record(JobState.FAILED, "the worker failed while running this job (see the worker log)")
        finally:
            self.on_exit(self)

    def _start(self) -> bool:
        spec_path = self._write_spec()
        env = self._environment()
        command = [sys.executable, "-m", "worker.trainer", str(spec_path)]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        if isinstance(self.inventory, SimulatedInventory):
            self.inventory.attach(self.process.pid, self.launch.indices)
        try:
            with self.ctx.db.write() as session:
                mark_running(
                    session,
                    self.launch.job_id,
                    self.launch.attempt,
                    {
                        "pid": self.process.pid,
                        "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"],
                        "artifacts_dir": str(self.artifacts),
                    },
                )
        except StaleAttemptError as err:
            log.warning("not running job %s attempt %s: %s", *self.key, err)
            self.outcome.stop = Stop.STALE
            self._kill_group()
            return False
        return True

    def _write_spec(self) -> Path:
        launch = self.launch
        settings = self.ctx.settings
        self.artifacts.mkdir(parents=True, exist_ok=True)
        spec = {
            "train": {
                k: launch.spec[k]
                for k in ("model", "dataset", "dataset_options", "hyperparameters", "variable_device", "tower_weights")
            },
            "runtime": {
                "job_id": launch.job_id,
                "attempt": launch.attempt,
                "artifacts_dir": str(self.artifacts),
                "data_dir": str(settings.data_dir.resolve()),
                "models_path": str(settings.models_path.resolve()),
                "simulated": launch.simulated,
                "num_devices": len(launch.indices),
                "gpu_memory_fraction": launch.fraction,
                "gpu_memory_total_mb": launch.memory_total_mb,
                "memory_growth": bool(launch.spec.get("memory_growth", False)),
                "parent_pid": os.getpid(),
            },
        }
        path = self.artifacts / f"spec-attempt-{launch.attempt}.json"
        path.write_text(json.dumps(spec, indent=2))
        return path

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.launch.indices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["PYTHONUNBUFFERED"] = "1"
        env["TF_CPP_MIN_LOG_LEVEL"] = env.get("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        return env

    # -- while it runs --------------------------------------------------------------------

    def _supervise(self) -> None:
        assert self.process is not None and self.process.stdout is not None and self.process.stderr is not None
        selector = selectors.DefaultSelector()
        partial = {"out": b"", "err": b""}
        selector.register(self.process.stdout, selectors.EVENT_READ, "out")
        selector.register(self.process.stderr, selectors.EVENT_READ, "err")
        started = time.monotonic()
        next_check = started
        while selector.get_map():
            for key, _ in selector.select(timeout=defaults.METRIC_FLUSH_INTERVAL_S):
                chunk = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    selector.unregister(key.fileobj)
                    if partial[key.data]:
                        self._line(key.data, partial[key.data])
                    continue
                lines = (partial[key.data] + chunk).split(b"\n")
                partial[key.data] = lines.pop()
                for line in lines:
                    self._line(key.data, line)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_EVERY_S
                self._check(now - started)
            self._escalate()
            if self.sink.due():
                self._flush()
        selector.close()
        while self.process.poll() is None:
            self._escalate()
            time.sleep(defaults.KILL_CHECK_INTERVAL_S)
        self.outcome.returncode = self.process.returncode

    def _line(self, stream: str, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if not text:
            return
        if stream == "out" and text.startswith("{"):
            try:
                event = json.loads(text)
            except json.JSONDecodeError:
                event = None
            if isinstance(event, dict) and "event" in event:
                self._event(event)
                return
        if stream == "err":
            self.outcome.last_stderr = (self.outcome.last_stderr + [text])[-20:]
        self.sink.log(_level_of(text) if stream == "err" else "info", text)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind in ("metric", "eval"):
            self.sink.metric(event)
            if kind == "metric" and isinstance(event.get("step"), int):
                self.outcome.step = event["step"]
        elif kind == "log":
            self.sink.log(str(event.get("level", "info")), str(event.get("message", "")), parse_time(event.get("time")))
        elif kind == "started":
            self._on_started(event)
        elif kind == "checkpoint":
            self.sink.log("info", f"checkpoint at step {event.get('step')}: {event.get('path')}")
            self._flush()  # what led up to a checkpoint is stored before going on
        elif kind == "done":
            self.outcome.done = event
        elif kind == "error":
            self.outcome.error = event
            self.sink.log("error", f"{event.get('kind', 'error')}: {event.get('message', '')}")
        elif kind == "stopped":
            self.sink.log("info", f"trainer stopped at step {event.get('step')} after a checkpoint")

    def _on_started(self, event: dict[str, Any]) -> None:
        resumed = event.get("resumed_from_step")
        if isinstance(resumed, int):
            self.sink.forget_after(resumed)
            for point in read_metrics_log(self.artifacts / METRICS_LOG):
                if point["step"] <= resumed:
                    self.sink.metric(point, publish=False)
            self.sink.log("info", f"resumed from the checkpoint of step {resumed}")
        self._flush(
            {
                "towers": event.get("towers"),
                "devices": event.get("devices"),
                "cuda_visible_devices": event.get("cuda_visible_devices"),
                "memory_limit_enforced": event.get("memory_limit_enforced"),
            }
        )

    def _flush(self, job_updates: dict[str, Any] | None = None) -> None:
        try:
            self.sink.flush(job_updates)
        except StaleAttemptError as err:
            self._stale(str(err))

    def _stale(self, why: str) -> None:
        if self.outcome.stop != Stop.STALE:
            log.warning("job %s attempt %s is stale (%s): killing its trainer", *self.key, why)
        self.outcome.stop = Stop.STALE
        self._kill_group()

    def _check(self, elapsed: float) -> None:
        """Poll the database: cancel requested? attempt still current? time limit?"""
        with self.ctx.db.read() as session:
            row = session.execute(
                select(Job.state, Job.attempts, Job.cancel_requested_at, Job.preempt_requested_at).where(
                    Job.id == self.launch.job_id
                )
            ).one_or_none()
        if (
            row is None
            or row.attempts != self.launch.attempt
            or row.state not in (JobState.DISPATCHED, JobState.RUNNING)
        ):
            self._stale("the job moved on")
            return
        if row.cancel_requested_at is not None:
            self.request_stop(Stop.CANCEL, "cancelled")
        elif row.preempt_requested_at is not None:
            self.request_stop(Stop.PREEMPT, "preempted to make room for a high-priority job")
        limit = self.launch.time_limit_s
        if limit is not None and elapsed > limit:
            self.request_stop(Stop.TIME_LIMIT, f"time limit of {limit} s reached")

    def _escalate(self) -> None:
        if not self._stop_requested.is_set() or self.process is None or self.process.poll() is not None:
            return
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.ctx.settings.cancel_grace_s
            self._signal_group(signal.SIGTERM)
        elif time.monotonic() >= self._stop_deadline:
            self._signal_group(signal.SIGKILL)

    # -- the end --------------------------------------------------------------------------

    def _end(self) -> None:
        self._kill_group()
        self._wait_gpus_free()
        if self.outcome.stop == Stop.STALE:
            return
        self._flush()
        if self.outcome.stop == Stop.STALE:
            return
        state, message = self._verdict()
        self._record(state, message)

    def _verdict(self) -> tuple[JobState, str | None]:
        o = self.outcome
        if o.stop in (Stop.SHUTDOWN, Stop.PREEMPT):
            return JobState.QUEUED, o.stop_message
        if o.stop == Stop.CANCEL:
            return JobState.CANCELLED, o.stop_message
        if o.stop == Stop.TIME_LIMIT:
            return JobState.FAILED, f"{o.stop_message} at step {o.step}"
        if o.done is not None and o.returncode == 0:
            return JobState.SUCCEEDED, None
        if o.error is not None:
            return JobState.FAILED, str(o.error.get("message") or o.error.get("kind"))
        return JobState.FAILED, _exit_message(o.returncode, o.last_stderr)

    def _record(self, state: JobState, message: str | None) -> None:
        try:
            with self.ctx.db.write() as session:
                if state == JobState.QUEUED:
                    requeue(session, current_attempt(session, *self.key), message or "interrupted", crashed=False)
                else:
                    finish(session, *self.key, state, error=message, exit_code=self.outcome.returncode)
                self.sink.trim_logs(session)
        except StaleAttemptError as err:
            log.info("not recording the end of job %s attempt %s: %s", *self.key, err)

    def _signal_group(self, signum: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass

    def _kill_group(self) -> None:
        """SIGKILL whatever is left of the trainer's process group and wait until it is gone."""
        if self.process is None:
            return
        self._signal_group(signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 30
        while _group_alive(self.process.pid) and time.monotonic() < deadline:
            self._signal_group(signal.SIGKILL)
            time.sleep(defaults.KILL_CHECK_INTERVAL_S)
        if self.outcome.returncode is None:
            self.outcome.returncode = self.process.returncode

    def _wait_gpus_free(self) -> None:
        """Hold the GPUs until the driver no longer lists the trainer on them."""
        if self.process is None:
            return
        pid = self.process.pid
        deadline = time.monotonic() + ZOMBIE_WAIT_S
        while pid in self.inventory.pids_on(self.launch.indices):
            if time.monotonic() > deadline:
                self._drain_gpus(pid)
                return
            time.sleep(0.5)

    def _drain_gpus(self, pid: int) -> None:
        log.error("pid %s still holds GPUs %s of job %s: draining them", pid, self.launch.indices, self.launch.job_id)
        with self.ctx.db.write() as session:
            for gpu in session.scalars(
                select(Gpu)
                .join(Host, Gpu.host_id == Host.id)
                .where(Host.name == self.launch.host, Gpu.index.in_(self.launch.indices))
            ):
                gpu.drained = True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(pid_alive(int(p)) for p in _group_members(pgid))


def _group_members(pgid: int) -> list[str]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid):
            members.append(entry)
    return members


def _level_of(line: str) -> str:
    head = line[:1]
    if head in ("E", "F") and line[1:2].isdigit():
        return "error"
    if head == "W" and line[1:2].isdigit():
        return "warning"
    if "Traceback" in line or "Error" in line.split(":")[0]:
        return "error"
    if "Warning" in line.split(":")[0]:
        return "warning"
    return "info"


def _exit_message(returncode: int | None, stderr: list[str]) -> str:
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"trainer killed by {name}{hint}"
    tail = next((line for line in reversed(stderr) if line.strip()), "")
    return f"trainer exited with code {returncode}" + (f": {tail[-500:]}" if tail else "")
