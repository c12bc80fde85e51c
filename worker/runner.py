"""Supervising one attempt of one job: the trainer's lines, stop requests, its end.

The trainer is started by `worker.launch`. A stop (cancel, time limit, preemption, worker
shutdown) is SIGTERM to its process group, which the trainer answers with a checkpoint,
then SIGKILL after the grace period. The GPUs are released only once the process group is
gone and the driver no longer lists the trainer. What the trainer's lines mean and how an
attempt's end becomes a job state is `worker.outcome`.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from service.core import defaults
from service.core.context import Context
from service.core.exceptions import StaleAttemptError
from service.core.gpus import set_drained
from service.core.lifecycle import current_attempt, finish, mark_running, requeue
from service.core.models import HOLDING_STATES, Allocation, Host, Job, JobState
from towerq.contract import events
from towerq.contract.spec import describe
from worker import program, rendezvous, sandbox
from worker.cgroups import AttemptGroup
from worker.folder import FolderWatch
from worker.inventory import Inventory, SimulatedInventory
from worker.launch import (
    Launch,
    artifacts_dir,
    attempt_limits,
    start_trainer,
    trainer_command,
    trainer_environment,
    trainer_user,
    write_trainer_spec,
)
from worker.outcome import Outcome, Stop, is_runtime_noise, level_of
from worker.pool import TrainerPool, hand_over
from worker.pool import end as end_warm
from worker.processes import descendants, kill_group, kill_pids, output_lines, read_process, signal_trainer
from worker.relay import MetricSink, parse_time
from worker.trainer import tunnel

log = logging.getLogger(__name__)

ZOMBIE_WAIT_S = 60.0
LEFTOVER_GRACE_S = 5.0
"""How long the trainer's output is still read after it exited: processes it started may
hold the pipes open (where no cgroup ends them), and its end must not wait for theirs."""
CHECK_EVERY_S = 1.0
STACK_FRAMES = 8
"""Frames of a stuck runner's stack written to the worker log."""
RANK_ZERO_RECORDS = (Stop.CANCEL, Stop.PREEMPT, Stop.TIME_LIMIT)
"""Stops every rank of a job over several hosts is asked for, whose end rank 0 records."""


class JobRunner:
    """Supervises one trainer process from start to recorded end, in its own thread."""

    def __init__(
        self,
        ctx: Context,
        inventory: Inventory,
        launch: Launch,
        on_exit: Callable[[JobRunner], None],
        sandboxed: bool = False,
        pool: TrainerPool | None = None,
    ) -> None:
        self.ctx = ctx
        self.sandboxed = sandboxed
        self.pool = pool
        self.warm = False
        """The trainer came warm from the pool (`worker.pool`)."""
        self.owes_refill = False
        """It did, and the pool has not yet been told to warm the next one."""
        self.program = program.is_program(launch.spec)
        """A command job: its own program, not towerq's trainer (`worker.program`)."""
        self.replaces_from: bool = self.program and launch.attempt > 1
        """A resumed command job's first point says where it resumed (`MetricSink.replace_from`)."""
        self.started_once = False
        """A valid `started` line came: later ones are the trainer's word only, and ignored."""
        self.trainer_pids: set[int] = set()
        """The trainer's pids: the process started, and (in the sandbox) the trainer inside."""
        self.inventory = inventory
        self.launch = launch
        self.on_exit = on_exit
        self.sink = MetricSink(ctx, launch.job_id, launch.attempt)
        if launch.ranks > 1:
            self.sink.prefix = f"[{launch.where}] "
        self.outcome = Outcome(ranks=launch.ranks, program=self.program)
        self.process: subprocess.Popen[bytes] | None = None
        self._stop_requested = threading.Event()
        self._look = threading.Event()
        """A control message came for this job: read the database at the next tick."""
        self._stop_deadline: float | None = None
        self._over_share_since: float | None = None
        """Since when its program has held more GPU memory than its share (`_watch_gpu_memory`)."""
        self._frozen_since: float | None = None
        """Since when its trainer has been stopped by a signal (`_watch_frozen`)."""
        self._moved_on_since: float | None = None
        """Since when the job has moved on while its trainer, which said it stopped, ends (`_moved_on`)."""
        self.artifacts = artifacts_dir(ctx.settings, launch.job_id)
        self.folder = FolderWatch(self.artifacts, ctx.settings.job_folder_max_bytes, ctx.settings.job_folder_check_s)
        self.group = AttemptGroup()
        """The attempt's cgroups (`worker.cgroups`): empty until it starts, or where none can be made."""
        self.gate: tunnel.Gate | None = None
        """A sandboxed rank of a job over several hosts: its way to the other ranks."""
        self.after: list[JobRunner] = []
        """The runners on this host that had some of this attempt's GPUs when it came. Those
        whose GPUs the database has already released are still ending (a job over several
        hosts releases every host's GPUs when one rank records its end, and the job's other
        ranks take a moment more to stop): this attempt starts once their trainers are gone."""
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

    def look(self) -> None:
        """Read the job's row soon (a control message said something changed). What the
        message itself says is not taken: anyone who reaches Redis can publish one."""
        self._look.set()

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
            self._close_gate()
            self._refill()
            self.group.remove()
            self.sink.close()
            self.on_exit(self)

    @property
    def chief(self) -> bool:
        """This attempt's trainer records the job's start, numbers and end (rank 0, or alone)."""
        return self.launch.rank == 0

    def _meet(self) -> bool:
        """A job over several hosts: wait until every rank is launched, and learn where they
        listen; False (the attempt given up, the job queued again) when they do not come."""
        if self.launch.ranks < 2:
            return True
        try:
            self.launch.cluster = rendezvous.meet(
                self.ctx.db,
                self.ctx.settings,
                self.launch.job_id,
                self.launch.attempt,
                self.launch.rank,
                self.launch.ranks,
                self._still_current,
                program.ports_per_rank(self.launch) if self.program else 1,
            )
            if self.sandboxed and not self.launch.spec.get("network"):
                self._open_gate()
        except rendezvous.RendezvousError as err:
            self.outcome.stop, self.outcome.stop_message = Stop.RENDEZVOUS, f"{self.launch.where}: {err}"
            return False
        self.sink.log("info", f"rank {self.launch.rank} of {self.launch.ranks}: {', '.join(self.launch.cluster)}")
        return True

    def _open_gate(self) -> None:
        """The sandboxed rank's only way out: its public port and control socket, held here
        (`worker.trainer.tunnel`); the trainer's sandbox gets no network of the host."""
        port = int(self.launch.cluster[self.launch.rank].rpartition(":")[2])
        folder = Path(tempfile.mkdtemp(prefix="towerq-rank-"))
        try:
            secrets = rendezvous.keys(self.ctx.db, self.launch.job_id, self.launch.attempt, self.launch.ranks)
            self.gate = tunnel.Gate(str(folder), ("0.0.0.0", port), self.launch.cluster, self.launch.rank, secrets)
        except OSError as err:
            shutil.rmtree(folder, ignore_errors=True)
            raise rendezvous.RendezvousError(f"port {port} for rank {self.launch.rank}: {err}") from err
        identity = trainer_user(self.ctx.settings)
        sandbox.hand_over(folder, identity)  # the trainer's user reaches the socket: nobody else does
        sandbox.hand_over(Path(self.gate.path), identity)
        self.launch.gate = folder

    def _close_gate(self) -> None:
        if self.gate is not None:
            self.gate.close()
            self.gate = None
        if self.launch.gate is not None:
            shutil.rmtree(self.launch.gate, ignore_errors=True)

    def _wait_for_earlier(self) -> None:
        ending = [r for r in self.after if r.thread.is_alive() and not self._holds_gpus(r)]
        for earlier in ending:
            job_id, attempt = earlier.key
            what = f"attempt {attempt}" if job_id == self.launch.job_id else f"job {job_id}"
            self.sink.log("info", f"waiting for {what} to leave GPUs {earlier.launch.indices} on this host first")
            began = time.monotonic()
            earlier.join(self.ctx.settings.cancel_grace_s + ZOMBIE_WAIT_S + 10)
            if earlier.thread.is_alive():  # its runner is stuck: its GPUs are released, so its trainer goes now
                log.error(
                    "the runner of job %s attempt %s did not end; killing its trainer. It was at:\n%s",
                    *earlier.key,
                    stack_of(earlier.thread),
                )
                earlier._kill_group()
            log.info("job %s attempt %s waited %.1f s for %s to leave", *self.key, time.monotonic() - began, what)
        self.after = []

    def _holds_gpus(self, other: JobRunner) -> bool:
        """Whether `other`'s attempt still holds GPUs on this host in the database (a job
        sharing a GPU by memory fraction does; one whose end was recorded does not)."""
        job_id, attempt = other.key
        with self.ctx.db.read() as session:
            held = session.scalar(
                select(Allocation.id)
                .join(Host, Host.id == Allocation.host_id)
                .where(
                    Allocation.job_id == job_id,
                    Allocation.attempt == attempt,
                    Allocation.released_at.is_(None),
                    Host.name == self.launch.host,
                )
                .limit(1)
            )
        return held is not None

    def _still_current(self) -> bool:
        return self._current(self._job_row())

    def _job_row(self) -> Any:
        """What the runner watches of its job's row (None: the job is gone)."""
        with self.ctx.db.read() as session:
            return session.execute(
                select(
                    Job.state, Job.attempts, Job.cancel_requested_at, Job.preempt_requested_at, Job.stop_reason
                ).where(Job.id == self.launch.job_id)
            ).one_or_none()

    def _current(self, row: Any) -> bool:
        """Whether `row` still has this attempt holding GPUs."""
        return row is not None and row.attempts == self.launch.attempt and row.state in HOLDING_STATES

    def _start(self) -> bool:
        self._wait_for_earlier()
        if not self._meet():
            return False
        settings = self.ctx.settings
        env = trainer_environment(self.launch.indices, settings.trainer_env_pass)
        # a rank sets up its cluster before any TensorFlow op: never a warm trainer
        pooled = self.pool is not None and self.launch.ranks < 2 and not self.program
        warm = self.pool.take(self.launch, self.artifacts) if self.pool is not None and pooled else None
        try:
            if self.program:
                command, cwd, env = self._program_start()
            else:
                spec_path = write_trainer_spec(self.launch, settings, self.artifacts, self.sandboxed)
        except (ValidationError, sandbox.SandboxError) as err:
            if warm is not None:
                end_warm(warm.process)
            self.outcome.stop = Stop.BAD_SPEC
            why = describe(err) if isinstance(err, ValidationError) else str(err)
            self.outcome.stop_message = f"the job's spec does not pass validation: {why}"
            return False
        limits = attempt_limits(self.launch, settings, len(self.inventory.gpus()))
        self.group = AttemptGroup.create(f"towerq-{os.getpid()}-job-{self.launch.job_id}-{self.launch.attempt}", limits)
        if warm is not None:
            self.group.adopt({warm.process.pid} | descendants(warm.process.pid))  # before it runs user code
        if warm is not None and hand_over(warm, spec_path, env):
            self.process, self.warm, self.owes_refill = warm.process, True, True
        elif self.program:
            # outside the sandbox nothing else ends a program whose worker died (bwrap does inside)
            death = None if self.sandboxed else program.die_with_parent
            self.process = start_trainer(command, cwd, env, self.group, death)
        else:
            command = trainer_command(self.launch, settings, spec_path, self.sandboxed)
            self.process = start_trainer(command, spec_path.parent, env, self.group)
        self.trainer_pids.add(self.process.pid)
        if self.program:
            how = f"the command {shlex.join(self.launch.spec['command'])[:500]}"
        else:
            how = "in a warm trainer from the pool" if self.warm else "in a new trainer (cold start)"
        self.sink.log("info", f"attempt {self.launch.attempt} runs {how}, pid {self.process.pid}")
        self.sink.log("info", self.group.describe(limits))
        for job_id, _ in self.launch.inputs:
            self.sink.log("info", f"job {job_id}'s folder is an input (read-only): params['inputs']['{job_id}']")
        for note in self.launch.notes:
            self.sink.log("warning", note)
        if isinstance(self.inventory, SimulatedInventory):
            self.inventory.attach(self.process.pid, self.launch.indices)
        if not self.chief:  # rank 0 records the job's start; this one watches its own trainer
            return True
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

    def _program_start(self) -> tuple[list[str], Path, dict[str, str]]:
        """A command job's process: its command, where it starts, its environment."""
        settings = self.ctx.settings
        program.prepare_folders(self.artifacts, trainer_user(settings) if self.sandboxed else None)
        seen = sandbox.JOB_PATH if self.sandboxed else self.artifacts
        env = program.program_environment(self.launch, settings, seen, self.sandboxed)
        command = program.program_command(self.launch, settings, self.artifacts, self.sandboxed)
        return command, self.artifacts if self.sandboxed else program.program_workdir(settings, self.launch), env

    # -- while it runs --------------------------------------------------------------------

    def _supervise(self) -> None:
        assert self.process is not None
        started = time.monotonic()
        next_check = started
        exited_at: float | None = None
        for line in output_lines(self.process, defaults.METRIC_FLUSH_INTERVAL_S, defaults.TRAINER_LINE_BYTES):
            if line is not None:
                self._line(*line)
                continue
            self.sink.send()
            now = time.monotonic()
            if exited_at is None and self.process.poll() is not None:
                exited_at = now
                self.group.kill()  # what it left behind holds its pipes open: it goes now
            elif exited_at is not None and now - exited_at > LEFTOVER_GRACE_S:
                self.sink.log("warning", "processes the trainer left behind still hold its output: not read further")
                break
            if now >= next_check or self._look.is_set():
                self._look.clear()
                next_check = now + CHECK_EVERY_S
                self._check(now - started)
                self._note_pids()
            if self.folder.due(now):
                self._measure_folder(now)
            self._escalate()
            if self.sink.due():
                self._flush()
        while self.process.poll() is None:
            self._escalate()
            time.sleep(defaults.KILL_CHECK_INTERVAL_S)
        self.outcome.returncode = self.process.returncode

    def _line(self, stream: str, raw: bytes) -> None:
        if len(raw) >= defaults.TRAINER_LINE_BYTES:
            limit = defaults.TRAINER_LINE_BYTES // 2**20
            self.sink.log(
                "warning", f"a line of the trainer's std{stream} over {limit} MiB was cut there (towerq's limit)"
            )
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if not text:
            return
        event = events.decode(text) if stream == "out" else None
        if event is not None and not (self.program and (event.event not in program.PROGRAM_EVENTS or not self.chief)):
            self._event(event)
            return  # (a program's `started`, `done`, ...: the trainer's words, text from it; rank 0 speaks for the job)
        if stream == "err":
            if is_runtime_noise(text):
                return
            self.outcome.stderr(text)
        self.sink.log(level_of(text) if stream == "err" else "info", text)

    def _event(self, event: events.TrainerEvent | events.Refused) -> None:
        match event:
            case events.Refused():
                said = f"a '{event.event}' line that does not fit the protocol was ignored: {event.why}"
                self.sink.log("warning", said)
            case events.Metric() | events.Eval():
                if self.replaces_from:
                    self.replaces_from = False
                    self.sink.replace_from(event.step)
                self.sink.metric(event)
                if isinstance(event, events.Metric):
                    self.outcome.step = event.step
                    self._refill()
            case events.Log():
                self.sink.log(event.level, event.message, parse_time(event.time))
            case events.Started():
                self._on_started(event)
            case events.Checkpoint():
                self.sink.log("info", f"checkpoint at step {event.step}: {event.path}")
                self._flush()  # what led up to a checkpoint goes to the database at once
            case events.Done():
                self.outcome.done = event.model_dump()
            case events.Error():
                self.outcome.error = {"kind": event.kind, "message": event.message}
                self.sink.log("error", event.message or event.kind)  # as the job's error
            case events.Stopped():
                self.outcome.agreed_stop = True
                self.sink.last_words = True
                self.sink.log("info", f"trainer stopped at step {event.step} after a checkpoint")

    def _on_started(self, started: events.Started) -> None:
        self._note_pids()  # the pid the line names is the trainer's word: not taken
        if self.started_once:  # a resume reads the trainer's metrics log back: once an attempt
            self.sink.log("warning", "a second 'started' line was ignored: an attempt starts once")
            return
        self.started_once = True
        if not self.chief:
            return
        if started.resumed_from_step is not None:
            self.sink.resume(started.resumed_from_step)
        self._flush(started.job_fields())

    def _note_pids(self) -> None:
        """The trainer's processes as the host numbers them (NVML's pids): bwrap's
        descendants in the sandbox (its pid namespace numbers them otherwise), the
        trainer's own outside it."""
        if self.process is not None:
            self.trainer_pids |= descendants(self.process.pid) | self.group.pids()

    def _refill(self) -> None:
        """This job is training (or over): the pool may warm the next trainer."""
        if self.owes_refill and self.pool is not None:
            self.owes_refill = False
            self.pool.refill()

    def _flush(self, job_updates: dict[str, Any] | None = None, wait: bool = False) -> None:
        try:
            self.sink.flush(job_updates, wait)
        except StaleAttemptError as err:
            self._stale(str(err))

    def _stale(self, why: str) -> None:
        if self.outcome.stop != Stop.STALE:
            log.warning("job %s attempt %s is stale (%s): killing its trainer", *self.key, why)
        self.outcome.stop = Stop.STALE
        self._kill_group()

    def _check(self, elapsed: float) -> None:
        """Poll the database: cancel requested? attempt still current? time limit?"""
        row = self._job_row()
        if not self._current(row):
            self._moved_on()
            return
        if row.cancel_requested_at is not None:
            self.request_stop(Stop.CANCEL, row.stop_reason or "cancelled")
        elif row.preempt_requested_at is not None:
            why = row.stop_reason or "stopped to make room for another job; it resumes from its checkpoint"
            self.request_stop(Stop.PREEMPT, why)
        limit = self.launch.time_limit_s
        if limit is not None and elapsed > limit:
            self.request_stop(Stop.TIME_LIMIT, f"time limit of {limit} s reached")
        if self.launch.ranks > 1:
            self._watch_frozen()
        if self.program and self.launch.fraction < 1 and not self.inventory.simulated:
            self._watch_gpu_memory()

    def _watch_gpu_memory(self) -> None:
        """A program sharing its GPUs has no framework limit towerq sets: NVML's count of
        its processes' memory must stay inside its share, or it is stopped after the grace."""
        settings = self.ctx.settings
        self._note_pids()
        over = program.over_share(
            self.inventory.refresh(), self.launch, self.trainer_pids, settings.gpu_memory_reserved_mb
        )
        now = time.monotonic()
        if over is None:
            self._over_share_since = None
        elif self._over_share_since is None:
            self._over_share_since = now
            self.sink.log("warning", f"{over}: stopped if it still does in {settings.gpu_memory_grace_s:g} s")
        elif now - self._over_share_since >= settings.gpu_memory_grace_s:
            self.request_stop(Stop.GPU_MEMORY, over)

    def _moved_on(self) -> None:
        """The job has moved on from this attempt: its trainer goes now, unless it said it
        stopped with the other ranks. Then rank 0 has recorded the stop, maybe before this
        worker read the line, and the trainer gets the stop's grace to exit on its own (its
        last lines are written: `MetricSink.last_words`)."""
        if not self.outcome.agreed_stop:
            self._stale("the job moved on")
            return
        now = time.monotonic()
        if self._moved_on_since is None:
            self._moved_on_since = now
        elif now - self._moved_on_since > self.ctx.settings.cancel_grace_s:
            self._stale(f"its trainer said it stopped but still ran {self.ctx.settings.cancel_grace_s:g} s later")

    def _watch_frozen(self) -> None:
        """A rank of a job over several hosts whose trainer is stopped by a signal (SIGSTOP)
        hangs the others. Once the ranks compute, their collective timeout notices; before,
        while the first collective waits up to `START_TIMEOUT_S` for every rank's start-up,
        only its worker can. Frozen for longer than the collective timeout, it is killed and
        the job goes back to the queue, as a crash."""
        now = time.monotonic()
        if not any((info := read_process(pid)) is not None and info.state in "Tt" for pid in self.trainer_pids):
            self._frozen_since = None
            return
        if self._frozen_since is None:
            self._frozen_since = now
        frozen_s = now - self._frozen_since
        if frozen_s < self.ctx.settings.collective_timeout_s or self.outcome.stop is not None:
            return
        where = f"{self.launch.where}: " if self.chief else ""
        self.outcome.stop = Stop.FROZEN
        self.outcome.stop_message = (
            f"{where}its trainer was frozen (stopped by a signal) for {frozen_s:.0f} s: killed, so the other "
            "ranks do not wait for it; the job goes back to the queue"
        )
        self.sink.log("error", self.outcome.stop_message)
        self._kill_group()

    def _measure_folder(self, now: float, running: bool = True) -> None:
        over = self.folder.measure(now)
        self._flush({"folder_bytes": self.folder.bytes})
        if running and over is not None and self.outcome.stop is None:
            self.outcome.stop, self.outcome.stop_message = Stop.FOLDER_FULL, f"stopped: {over}"
            self.sink.log("error", f"stopped: {over}")
            self._kill_group()  # a checkpoint would only write more

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
        if self.outcome.stop != Stop.STALE:
            self._measure_folder(time.monotonic(), running=False)  # its size, for the Usage page
        self.outcome.limits_hit = self.group.limits_hit()
        for hit in self.outcome.limits_hit:
            self.sink.log("error", f"the attempt reached its {hit} (towerq's limit; see TOWERQ_TRAINER_*)")
        self._wait_gpus_free()
        if self.outcome.stop == Stop.STALE:
            return
        self._flush(wait=True)
        if self.outcome.stop in (Stop.STALE, Stop.EXECUTOR):
            return  # an executor's stop: the scheduler records the end from the cluster's word
        state, message = self.outcome.verdict(self.launch.fraction)
        if not self.chief and (state == JobState.SUCCEEDED or self.outcome.stop in RANK_ZERO_RECORDS):
            return  # rank 0 records a success, and a stop every rank was asked for
        if not self.chief and self.outcome.stop is None and self.outcome.agreed_stop:
            return  # stopped with the others before this worker saw the request: rank 0 records it
        if not self.chief and message:
            message = f"{self.launch.where}: {message}"
        self._record(state, message)

    def _record(self, state: JobState, message: str | None) -> None:
        try:
            with self.ctx.db.write() as session:
                if state == JobState.QUEUED:
                    job = current_attempt(session, *self.key)
                    if self.outcome.out_of_memory:
                        job.gpu_memory_fraction = 1.0  # its next attempt gets whole GPUs
                    requeue(session, job, message or "interrupted", crashed=self.outcome.crashed)
                else:
                    finish(session, *self.key, state, error=message, exit_code=self.outcome.returncode)
                self.sink.trim_logs(session)
        except StaleAttemptError as err:
            log.info("not recording the end of job %s attempt %s: %s", *self.key, err)

    def _signal_group(self, signum: int) -> None:
        if self.process is not None:
            signal_trainer(self.process.pid, signum, self.sandboxed)

    def _kill_group(self) -> None:
        """SIGKILL whatever is left of the trainer's process group and wait until it is gone."""
        if self.process is None:
            return
        self._note_pids()
        self._signal_group(signal.SIGKILL)
        self.process.wait()
        if not kill_group(self.process.pid):
            log.error("the process group of job %s attempt %s outlived SIGKILL", *self.key)
        if not self.group.kill():  # what left the group (setsid, double fork) is still in the cgroup
            log.error("processes of job %s attempt %s outlived SIGKILL in its cgroup", *self.key)
        # in the sandbox they die a moment after bwrap; a copy: another runner may be the killer
        if not kill_pids(set(self.trainer_pids)):
            log.error("processes %s of job %s attempt %s outlived SIGKILL", self.trainer_pids, *self.key)
        if self.outcome.returncode is None:
            self.outcome.returncode = self.process.returncode

    def _wait_gpus_free(self) -> None:
        """Hold the GPUs until the driver no longer lists the trainer on them; drain them
        (no new work there) when it still does after ZOMBIE_WAIT_S."""
        if self.process is None or self.inventory.wait_released(self.trainer_pids, self.launch.indices, ZOMBIE_WAIT_S):
            return
        log.error(
            "pids %s still hold GPUs %s of job %s: draining them", self.trainer_pids, self.launch.indices, self.key[0]
        )
        with self.ctx.db.write() as session:
            set_drained(session, self.launch.host, self.launch.indices, True)


def stack_of(thread: threading.Thread) -> str:
    """Where `thread` is now: its innermost frames, for a log line about a stuck runner."""
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)[-STACK_FRAMES:]) if frame is not None else "(it has ended)"
