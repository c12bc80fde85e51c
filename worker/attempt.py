"""Supervising one attempt of one job: its process's lines, stop requests, its end.

An attempt runs one process (bwrap around it in the sandbox): towerq's trainer for a model
job (`worker.runner.JobRunner`) or the member's program for a command job
(`worker.program.ProgramRunner`). What they share is here: waiting for the GPUs' earlier
attempt to be gone, meeting the other ranks of a job over several hosts
(`worker.rank_link`), starting the process in the attempt's cgroups, reading its output
line by line (its protocol lines, `towerq.contract.events`, and text), asking towerq for a
stop, and the end: what it asks and reports goes through the attempt's channel
(`towerq.contract.attempts`). A stop (cancel, time limit, preemption, worker shutdown)
is SIGTERM to the process group, then SIGKILL after the grace period; the GPUs are released
only once every process of the attempt is gone and the driver no longer lists one
(`worker.reaper`). How an attempt's end becomes a job state is `worker.outcome`.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from service.core import defaults
from service.core.attempts import LocalChannel
from service.core.context import Context
from service.core.models import JobState
from service.core.settings import Settings
from towerq.contract import events
from towerq.contract.attempts import (
    MAX_FOLDER_BYTES,
    AttemptChannel,
    AttemptEnd,
    StaleAttempt,
    time_limit_text,
)
from towerq.contract.spec import describe
from towerq.contract.times import limit_text
from towerq.contract.versions import NewerSpecError
from worker import disk, reaper, rendezvous, sandbox
from worker.attempt_disk import AttemptDisk
from worker.cgroups import AttemptGroup, Limits
from worker.folder import FolderWatch
from worker.gpu_use import GpuUseSampler
from worker.inventory import Inventory, SimulatedInventory
from worker.launch import Launch, artifacts_dir, attempt_limits
from worker.lines import without_escapes
from worker.outcome import ASKED, NotStarted, Outcome, StderrLevels, Stop, is_runtime_noise
from worker.phases import Phases
from worker.processes import descendants, output_lines, signal_trainer
from worker.rank_link import RankLink
from worker.relay import MetricSink, parse_time
from worker.sandbox_status import TrainerProcess, sandbox_failed

log = logging.getLogger(__name__)

LEFTOVER_GRACE_S = 5.0
"""How long the process's output is still read after it exited: processes it started may
hold the pipes open (where no cgroup ends them), and its end must not wait for theirs."""
CHECK_EVERY_S = 1.0
SLOW_END_S = 5.0
"""An attempt whose end (after its process exited) takes longer is said in the worker's log,
phase by phase."""


Starter = Callable[[AttemptGroup], tuple[subprocess.Popen[bytes], dict[str, str], str]]
"""Starts the attempt's process in its cgroups: the process, its environment, and how it
runs, in words for the job's log."""


class AttemptRunner:
    """One attempt on this host, in a thread of its own (`start`)."""

    program = False
    """A member's program (a command job), not towerq's trainer."""
    session = False
    """A notebook session (`worker.notebook`)."""
    _exited_at: float | None = None
    """When its process exited (monotonic), once it did."""
    _recorded = False
    """The attempt's end is in the database already (`_record_now`), before its process is gone."""

    def __init__(
        self,
        ctx: Context | None,
        inventory: Inventory,
        launch: Launch,
        on_exit: Callable[[Any], None],
        sandboxed: bool = False,
        *,
        channel: AttemptChannel | None = None,
        settings: Settings | None = None,
    ) -> None:
        """`ctx`: the lab's database and Redis, on a GPU host's worker; an executor's remote
        side has none, only its attempt's `channel` (over HTTP) and its `settings`."""
        self.ctx = ctx
        if channel is None:
            assert ctx is not None, "an attempt talks to towerq through its channel or the lab's database"
            channel = LocalChannel(ctx, launch.job_id, launch.attempt)
        self.channel = channel
        self.settings = settings or (ctx.settings if ctx is not None else Settings())
        self.sandboxed = sandboxed
        self.trainer_pids: set[int] = set()
        """The attempt's pids: the process started, and (in the sandbox) what runs inside."""
        self.inventory = inventory
        self.launch = launch
        self.on_exit = on_exit
        self.sink = MetricSink(self.channel, self.settings)
        self.sink.speaks = launch.rank == 0
        if launch.ranks > 1:
            self.sink.prefix = f"[{launch.where}] "
        self.outcome = Outcome(ranks=launch.ranks, program=self.program, session=self.session)
        self.stderr_levels = StderrLevels()
        self.process: subprocess.Popen[bytes] | None = None
        self.rank = RankLink(ctx, launch)
        self._stop_requested = threading.Event()
        self._look = threading.Event()
        """A control message came for this job: read the database at the next tick."""
        self._stop_deadline: float | None = None
        self.artifacts = artifacts_dir(self.settings, launch.job_id)
        self.folder = FolderWatch(self.artifacts, self.settings.job_folder_max_bytes, self.settings.job_folder_check_s)
        self.folder_disk = AttemptDisk(self.artifacts, self.settings, self.key, self.sink)
        """The job folder's disk of its own, if it gets one (`worker.attempt_disk`)."""
        idle_warn_s = 0.0 if self.session else self.settings.gpu_idle_warn_s  # a session ends when idle
        idle_stop_s = 0.0 if self.session else self.settings.gpu_idle_stop_s
        # over several hosts each rank sees only its own GPUs: towerq stops the job once every
        # rank's figures say they are idle (`AttemptStatus.stop`), not when one rank's are
        stop = functools.partial(self.request_stop, Stop.GPU_IDLE) if launch.ranks == 1 else None
        self.gpu_use = GpuUseSampler(
            launch.rank, launch.indices, self.settings.gpu_use_sample_s,
            idle_warn_s, functools.partial(self.sink.log, "warning"), idle_stop_s, stop,
        )  # fmt: skip
        self.group = AttemptGroup()
        """The attempt's cgroups (`worker.cgroups`): empty until it starts, or where none can be made."""
        self.after: list[AttemptRunner] = []
        """The runners on this host that had some of this attempt's GPUs when it came. Those
        whose GPUs the database has already released are still ending (a job over several
        hosts releases every host's GPUs when one rank records its end, and the job's other
        ranks take a moment more to stop): this attempt starts once their processes are gone."""
        self.thread = threading.Thread(target=self.run, name=f"job-{launch.job_id}-{launch.attempt}", daemon=True)

    @property
    def lab(self) -> Context:
        """The lab's database and Redis: a GPU host's worker has them, an executor's remote
        side (`worker.slurm`) does not (a job over several hosts, a notebook: hosts only)."""
        if self.ctx is None:
            raise RuntimeError(f"job {self.launch.job_id}: this needs a GPU host's worker, not an executor's node")
        return self.ctx

    @property
    def key(self) -> tuple[int, int]:
        return (self.launch.job_id, self.launch.attempt)

    @property
    def chief(self) -> bool:
        """This attempt records the job's start, numbers and end (rank 0, or alone)."""
        return self.launch.rank == 0

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def request_stop(self, reason: Stop, message: str) -> None:
        """Ask the process to checkpoint and stop (SIGTERM now, SIGKILL after the grace)."""
        if self.outcome.stop is None:
            self.outcome.stop = reason
            self.outcome.stop_message = message
        self._stop_requested.set()

    def look(self) -> None:
        """Read the job's row soon (a control message said something changed). What the
        message itself says is not taken: anyone who reaches Redis can publish one."""
        self._look.set()

    # -- what each kind of attempt says ---------------------------------------------------

    def _prepare(self) -> Starter:
        """Everything before the process starts (its files, its command); raises
        `ValidationError` or `SandboxError` for a job that cannot start as asked."""
        raise NotImplementedError

    def _ports(self) -> int:
        """The run of ports this host's rank takes at the rendezvous."""
        return 1

    def _takes(self, event: events.TrainerEvent | events.Refused) -> bool:
        """Whether a protocol line from the process is an event of the job (else it is text)."""
        return True

    def _event(self, event: events.TrainerEvent | events.Refused) -> None:
        match event:
            case events.Refused():
                said = f"a '{event.event}' line that does not fit the protocol was ignored: {event.why}"
                self.sink.log("warning", said)
            case events.Metric() | events.Eval():
                self.sink.metric(event)
                if isinstance(event, events.Metric):
                    self.outcome.step = event.step
            case events.Log():
                self.sink.log(event.level, event.message, parse_time(event.time))

    def _watch(self) -> None:
        """Checks of its own, with the database's (every `CHECK_EVERY_S`)."""

    def _after(self) -> None:
        """Once the attempt is over, whatever happened."""

    # -- the thread -----------------------------------------------------------------------

    def run(self) -> None:
        try:
            if self._start():
                self._supervise()
            self._end()
        except Exception:
            log.exception("runner for job %s attempt %s failed", *self.key)
            self._kill_group()
            self._record(
                self.outcome.attempt_end(
                    JobState.FAILED, "the worker failed while running this job (see the worker log)"
                )
            )
        finally:
            if isinstance(self.process, TrainerProcess):
                self.process.close_status()
            self.rank.close()
            self.folder_disk.close(self.outcome)
            self._after()
            self.group.remove()
            self.sink.close()
            self.on_exit(self)

    def _meet(self) -> bool:
        """A job over several hosts: wait until every rank is launched, and learn where they
        listen; False (the attempt given up, the job queued again) when they do not come."""
        if self.launch.ranks < 2:
            return True
        try:
            self.rank.meet(self._still_current, self._ports(), self.sandboxed)
        except rendezvous.RendezvousError as err:
            self.outcome.stop, self.outcome.stop_message = Stop.RENDEZVOUS, f"{self.launch.where}: {err}"
            return False
        self.sink.log("info", f"rank {self.launch.rank} of {self.launch.ranks}: {', '.join(self.launch.cluster)}")
        return True

    def _wait_for_earlier(self) -> None:
        reaper.wait_for_earlier(self, self.after)
        self.after = []

    def _still_current(self) -> bool:
        return self.channel.status().current

    def _start(self) -> bool:
        self._wait_for_earlier()
        if not self._meet():
            return False
        settings = self.settings
        try:
            self.folder_disk.hold(self.ctx, self.launch.ranks)
            starter = self._prepare()
            self.folder_disk.fill()
        except disk.DiskError as err:
            self.outcome.stop = Stop.FOLDER_FULL
            self.outcome.stop_message = f"its folder could not be put on a disk of its own: {err}"
            return False
        except (ValidationError, NewerSpecError, sandbox.SandboxError) as err:
            self.outcome.stop = Stop.BAD_SPEC
            why = describe(err) if isinstance(err, ValidationError) else str(err)
            self.outcome.stop_message = f"the job's spec does not pass validation: {why}"
            return False
        except NotStarted as err:
            self.outcome.stop, self.outcome.stop_message = err.stop, err.message
            return False
        except StaleAttempt as err:  # towerq moved on while it prepared (a session's door)
            log.warning("not starting job %s attempt %s: %s", *self.key, err)
            self.outcome.stop = Stop.STALE
            return False
        limits = attempt_limits(self.launch, settings, len(self.inventory.gpus()))
        self.group = AttemptGroup.create(f"towerq-{os.getpid()}-job-{self.launch.job_id}-{self.launch.attempt}", limits)
        self.process, env, how = starter(self.group)
        self.gpu_use.started(time.monotonic())
        self.trainer_pids.add(self.process.pid)
        self._say_started(how, limits)
        if isinstance(self.inventory, SimulatedInventory):
            self.inventory.attach(self.process.pid, self.launch.indices)
        if not self.chief:  # rank 0 records the job's start; this one watches its own process
            return True
        try:
            self.channel.running(self.process.pid, env["CUDA_VISIBLE_DEVICES"], str(self.artifacts))
        except StaleAttempt as err:
            log.warning("not running job %s attempt %s: %s", *self.key, err)
            self.outcome.stop = Stop.STALE
            self._kill_group()
            return False
        return True

    def input_named(self, job_id: int) -> str:
        """Where the attempt's code finds the input folder of job `job_id`: a model, in its params."""
        return f"params['inputs']['{job_id}']"

    def _say_started(self, how: str, limits: Limits) -> None:
        assert self.process is not None
        self.sink.log("info", f"attempt {self.launch.attempt} runs {how}, pid {self.process.pid}")
        self.sink.log("info", self.group.describe(limits))
        for job_id, _ in self.launch.inputs:
            self.sink.log("info", f"job {job_id}'s folder is an input (read-only): {self.input_named(job_id)}")
        for note in self.launch.notes:
            self.sink.log("warning", note)

    # -- while it runs --------------------------------------------------------------------

    def _supervise(self) -> None:
        assert self.process is not None
        started = time.monotonic()
        next_check = started
        exited_at: float | None = None
        for line in output_lines(self.process, defaults.METRIC_FLUSH_INTERVAL_S):
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
                if exited_at is None and (gpu_use := self.gpu_use.take(self.inventory, self.trainer_pids, now)):
                    self._flush({"gpu_use": gpu_use})
            if self.folder.due(now):
                self._measure_folder(now)
            self._escalate()
            if self.sink.due():
                self._flush()
        while self.process.poll() is None:
            self._escalate()
            time.sleep(defaults.KILL_CHECK_INTERVAL_S)
        self._exited_at = exited_at if exited_at is not None else time.monotonic()
        self.outcome.returncode = self.process.returncode
        self.outcome.sandbox_failed = sandbox_failed(self.process, self.outcome.last_stderr)

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
        if event is not None and self._takes(event):
            self._event(event)
            return
        text = without_escapes(text)
        if not text.strip():
            return
        if stream == "err":
            if is_runtime_noise(text) and not self.program:  # a member's program keeps every line
                return
            self.outcome.stderr(text)
        self.sink.log(self.stderr_levels(text) if stream == "err" else "info", text)

    def _note_pids(self) -> None:
        """The attempt's processes as the host numbers them (NVML's pids): bwrap's
        descendants in the sandbox (its pid namespace numbers them otherwise), the
        process's own outside it."""
        if self.process is not None:
            self.trainer_pids |= descendants(self.process.pid) | self.group.pids()

    def _live_pids(self) -> set[int]:
        """The attempt's processes now (its cgroups', else the process and its descendants):
        not `trainer_pids`, whose numbers of ended processes may be another's by now."""
        if self.process is None:
            return set()
        return {self.process.pid} | descendants(self.process.pid) | self.group.pids()

    def _flush(self, job_updates: dict[str, Any] | None = None, wait: bool = False) -> None:
        try:
            self.sink.flush(job_updates, wait)
        except StaleAttempt as err:
            self._stale(str(err))

    def _stale(self, why: str) -> None:
        if self.outcome.stop != Stop.STALE:
            log.warning("job %s attempt %s is stale (%s): killing its trainer", *self.key, why)
        self.outcome.stop = Stop.STALE
        self.sink.job_moved_on()
        self._kill_group()

    def _check(self, elapsed: float) -> None:
        """Ask towerq: attempt still current? a stop asked? Then the time limit, counted
        from the attempt's start: rank 0's (alone, its only rank); the other ranks of a job
        over several hosts stop when towerq asks, counting from rank 0's start, so that no
        rank stops first and its peers' programs end as if it crashed."""
        status = self.channel.status()
        if not status.current:
            self._moved_on()
            return
        if status.stop is not None:
            self.request_stop(ASKED[status.stop], status.reason or status.stop)
        if status.limit_known and status.time_limit_s != self.launch.time_limit_s:
            self._retime(status.time_limit_s)
        limit = self.launch.time_limit_s
        if limit is not None and elapsed > limit and self.chief:
            self.request_stop(Stop.TIME_LIMIT, time_limit_text(limit))
        if self.launch.ranks > 1:
            self._watch_frozen()
        self._watch()

    def _retime(self, limit: int | None) -> None:
        """The job's time limit changed while it runs (`towerq update --time-limit`): from
        now on this attempt stops at the new one, counted from its start as before."""
        was = self.launch.time_limit_s
        self.launch.time_limit_s = limit
        self.sink.log(
            "info",
            f"time limit changed to {limit_text(limit)} (was {limit_text(was)}), counted from the attempt's start",
        )

    def _moved_on(self) -> None:
        """The job has moved on from this attempt: its process goes now, unless it said it
        stopped with the other ranks. Then rank 0 has recorded the stop, maybe before this
        worker read the line, and the trainer gets the stop's grace to exit on its own (its
        last lines are written: `MetricSink.last_words`)."""
        grace = self.settings.cancel_grace_s
        if self._recorded:
            return  # this runner moved the job on (`_record_now`); its process is going
        if not self.outcome.agreed_stop:
            self._stale("the job moved on")
        elif self.rank.grace_over(grace):
            self._stale(f"its trainer said it stopped but still ran {grace:g} s later")

    def _watch_frozen(self) -> None:
        """A rank of a job over several hosts whose process is stopped by a signal (SIGSTOP)
        hangs the others. Once the ranks compute, their collective timeout notices; before,
        while the first collective waits up to `START_TIMEOUT_S` for every rank's start-up,
        only its worker can. Frozen for longer than the collective timeout, it is killed and
        the job goes back to the queue, as a crash."""
        frozen_s = self.rank.frozen_for(self.trainer_pids)
        if frozen_s < self.settings.collective_timeout_s or self.outcome.stop is not None:
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
        over = self.folder.measure(now, self._live_pids() if running else ())
        held = self.folder.bytes
        self._flush({"folder_bytes": min(held, MAX_FOLDER_BYTES) if held is not None else None})
        if running and over is not None and self.outcome.stop is None:
            self.outcome.stop, self.outcome.stop_message = Stop.FOLDER_FULL, f"stopped: {over}"
            self.sink.log("error", f"stopped: {over}")
            self._kill_group()  # a checkpoint would only write more

    def _escalate(self) -> None:
        if not self._stop_requested.is_set() or self.process is None or self.process.poll() is not None:
            return
        if self._stop_deadline is None:
            grace = self.settings.cancel_grace_s
            self._stop_deadline = time.monotonic() + grace
            why = self.outcome.stop_message or self.outcome.stop or "asked to stop"
            self.sink.log("info", f"stopping it: {why} (SIGTERM now; SIGKILL in {grace:g} s unless it has ended)")
            self._signal_group(signal.SIGTERM)
        elif time.monotonic() >= self._stop_deadline:
            self._signal_group(signal.SIGKILL)

    # -- the end --------------------------------------------------------------------------

    def _record_now(self) -> None:
        """Record the attempt's end now, before its process is gone: its last word leaves
        nothing to wait for. The process is SIGKILLed first, so it writes nothing after the
        job moved on; it may take a while to be gone (the kernel tears a large process down at
        the pace a busy host schedules it: 14 s seen under the suite's load), and its GPUs stay
        this runner's until it is (`reaper`: a next attempt there waits for this runner)."""
        if self.process is not None and self.process.poll() is None:
            self._signal_group(signal.SIGKILL)
        self.sink.last_words = True  # its lines still come, as this attempt's
        self._flush(wait=True)
        self._verdict_and_record()
        self._recorded = True

    def _end(self) -> None:
        phases = Phases(since=self._exited_at)
        if self._exited_at is not None:
            phases.mark("its output after its exit")
        self._kill_group()
        phases.mark("kill")
        self.folder_disk.close(self.outcome)
        phases.mark("disk")
        if self.outcome.stop != Stop.STALE:
            self._measure_folder(time.monotonic(), running=False)  # its size, for the Usage page
        phases.mark("folder")
        self.outcome.limits_hit = self.group.limits_hit()
        for hit in self.outcome.limits_hit:
            self.sink.log("error", f"the attempt reached its {hit} (towerq's limit; see TOWERQ_TRAINER_*)")
        if self.process is not None:
            where = (self.launch.host, self.launch.indices)
            reaper.wait_gpus_free(self.channel, self.inventory, *where, self.trainer_pids)
        phases.mark("GPUs free")
        if self.outcome.stop == Stop.STALE:
            if self.sink.moved_on:
                self._flush(wait=True)  # what rank 0 read before the move: the points the attempt trained
            return
        self._flush(wait=True)
        phases.mark("flush")
        if self._recorded:
            return  # its end is in the database already (`_record_now`): these were its last lines
        try:
            self._verdict_and_record()
        finally:
            phases.mark("record")
            if phases.total() > SLOW_END_S:  # the job's next attempt, or the next job, waited this long
                log.warning("job %s attempt %s took %.1f s to end (%s)", *self.key, phases.total(), phases)

    def _verdict_and_record(self) -> None:
        if (end := self.outcome.recorded_end(self.launch.fraction, self.chief, self.launch.where)) is not None:
            self._record(end)

    def _record(self, end: AttemptEnd) -> None:
        try:
            self.channel.end(end)
        except StaleAttempt as err:
            log.info("not recording the end of job %s attempt %s: %s", *self.key, err)

    def _signal_group(self, signum: int) -> None:
        if self.process is not None:
            signal_trainer(self.process.pid, signum, self.sandboxed)

    def _kill_group(self) -> None:
        """SIGKILL whatever is left of the attempt's processes and wait until they are gone."""
        if self.process is None:
            return
        self._note_pids()
        reaper.kill_attempt(self.process, self.group, self.trainer_pids, self.sandboxed, self.key)
        if self.outcome.returncode is None:
            self.outcome.returncode = self.process.returncode
