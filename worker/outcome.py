"""What an attempt's end means: why it stopped, what the trainer said, the job's new state.

Kept apart from the runner's loop, as rq keeps `job_lifecycle` apart from its worker: the
runner collects facts into an `Outcome`; `verdict` alone turns them into a job state.
"""

from __future__ import annotations

import enum
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from service.core.models import JobState
from towerq.contract.attempts import AttemptEnd, Ending
from towerq.contract.attempts import Stop as AskedStop
from worker import pyenv
from worker.trainer.protocol import EXIT_STOPPED

STDERR_LINES_KEPT = 20


class Stop(enum.StrEnum):
    CANCEL = "cancel"
    TIME_LIMIT = "time_limit"
    SHUTDOWN = "shutdown"
    PREEMPT = "preempt"
    STALE = "stale"
    BAD_SPEC = "bad_spec"
    FOLDER_FULL = "folder_full"
    RENDEZVOUS = "rendezvous"
    """A job over several hosts: the other ranks did not come (`worker.rendezvous`)."""
    FROZEN = "frozen"
    """A job over several hosts: this rank's trainer was stopped by a signal (SIGSTOP) for
    longer than the collective timeout, so its worker killed it; the job queues again."""
    GPU_IDLE = "gpu_idle"
    """A job whose GPUs stayed idle for the lab's `TOWERQ_GPU_IDLE_STOP_S`
    (`worker.gpu_use`): it fails, saying for how long; its checkpoint is kept."""
    GPU_MEMORY = "gpu_memory"
    """A command job held more GPU memory than its share for longer than the grace
    (`worker.program.over_share`): it fails, and the message names both numbers."""
    IDLE = "idle"
    """A notebook session idle for its `idle_timeout_s` (`worker.notebook`): it ends, succeeded."""
    NOT_READY = "not_ready"
    """A notebook session whose JupyterLab did not answer in time: it fails."""
    SWEEP = "sweep"
    """A setting of an adaptive sweep stopped at a rung, its metric behind the others'
    (`service.jobs.asha`): it ends succeeded, with the reason; its checkpoint is kept."""
    NO_DOOR = "no_door"
    """A notebook session whose door could not open (no free port of `TOWERQ_RANK_PORTS` on
    its host, or towerq did not take it): the attempt is lost, the session queued again
    (counted against its `max_attempts`), and the reason says why."""
    CANNOT_HERE = "cannot_here"
    """The host cannot run this kind of attempt as it is set up (a notebook session where
    JupyterLab is missing, or on a root worker without the sandbox): it fails, saying why."""
    EXECUTOR = "executor"
    """The executor's cluster stopped the attempt (Slurm's SIGTERM: `scancel`, a time limit,
    a node going away): the trainer checkpoints, and the scheduler records the end from
    what the cluster says (`service.executors.base.Ended`)."""


class NotStarted(Exception):  # noqa: N818 - the name says what happened
    """The attempt cannot start: `stop` says what becomes of it, `message` why."""

    def __init__(self, stop: Stop, message: str) -> None:
        super().__init__(message)
        self.stop = stop
        self.message = message


@dataclass
class Outcome:
    done: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    stop: Stop | None = None
    stop_message: str | None = None
    returncode: int | None = None
    last_stderr: list[str] = field(default_factory=list)
    step: int | None = None
    agreed_stop: bool = False
    """A rank's trainer said it stopped after a checkpoint: the ranks agreed to stop, as
    some rank's worker asked (cancel, preemption, slicing), and rank 0 records it."""
    limits_hit: list[str] = field(default_factory=list)
    """Limits of the attempt's cgroup the kernel enforced (`worker.cgroups`)."""
    ranks: int = 1
    """How many hosts the attempt runs on (a trainer, a rank, on each)."""
    program: bool = False
    """A command job's program: it succeeds by exiting 0 (it says no `done`)."""
    session: bool = False
    """A notebook session: ended, not queued again, by its idle or time limit and the worker's stop."""
    sandbox_failed: bool = False
    """bwrap's setup failed before it ran the command (`worker.sandbox_status`): nothing of
    the job ran; the attempt was lost, as a crash, and the job queues again."""

    @property
    def who(self) -> str:
        return "the program" if self.program else "trainer"

    def stderr(self, line: str) -> None:
        self.last_stderr = (self.last_stderr + [line])[-STDERR_LINES_KEPT:]

    @property
    def killed_from_outside(self) -> bool:
        """The trainer was killed, or stopped, by a signal towerq did not send (an admin's
        kill, the kernel's OOM killer): a crash of the attempt, not the job's fault, so the
        job is tried again from its last checkpoint, counting against max_attempts. Also
        after `done`: killed while exiting, it may not have finished writing what it wrote
        last; the next attempt resumes at the final checkpoint and ends at once."""
        killed = self.returncode is not None and (self.returncode < 0 or self.returncode == EXIT_STOPPED)
        return killed and self.stop is None and self.error is None

    @property
    def peer_lost(self) -> bool:
        """A job over several hosts: another rank died, froze or stalled (`worker.trainer.ranks`).
        The trainer's word, on the stdout user code prints to: a one-host job has no peer,
        and its claim of one is an error like any other (not a crash it may retry)."""
        return self.ranks > 1 and self.error is not None and self.error.get("kind") == "peer_lost"

    @property
    def rank_died(self) -> bool:
        """A job over several hosts: this rank's trainer ended without a word of why (no
        error line, no stop asked), by any exit code: a sandboxed trainer killed by a signal
        exits with 128 + its number, which an exit of its own can say too. Its peers notice
        (`peer_lost`) and the whole gang queues again as a crash, so this rank must not
        record a failure first."""
        succeeded = self.done is not None and self.returncode == 0
        return (
            self.ranks > 1
            and self.stop is None
            and self.error is None
            and self.returncode is not None
            and not succeeded
        )

    @property
    def crashed(self) -> bool:
        """The attempt was lost, not the job's fault: it counts against max_attempts."""
        lost = self.stop in (Stop.RENDEZVOUS, Stop.FROZEN, Stop.NO_DOOR) or self.never_ran
        return self.killed_from_outside or self.peer_lost or self.rank_died or lost

    @property
    def never_ran(self) -> bool:
        """The sandbox never started the command, and nothing stopped it on purpose."""
        return self.sandbox_failed and self.stop is None

    @property
    def trained(self) -> bool:
        """A model job's trainer trained its last step, saved, exported and said `done`: a
        stop asked after its last step (a cancel, a preemption, the time limit, the worker's
        shutdown) came too late to matter, so the job succeeded."""
        return self.done is not None and self.returncode == 0 and not self.program and not self.session

    @property
    def out_of_memory(self) -> bool:
        return self.error is not None and self.error.get("kind") == "oom"

    def recorded_end(self, fraction: float, chief: bool, where: str) -> AttemptEnd | None:
        """What this rank records of the attempt's end (`chief`: rank 0, or alone; `where`:
        its host, for another rank's reason), or None where it records nothing: a stale
        attempt, one an executor stopped (the scheduler records its end from the cluster's
        word), and on a rank other than 0 a success or a stop every rank was asked for, which
        rank 0 records."""
        if self.stop in (Stop.STALE, Stop.EXECUTOR):
            return None
        state, message = self.verdict(fraction)
        if not chief and (state == JobState.SUCCEEDED or self.stop in RANK_ZERO_RECORDS):
            return None
        if not chief and self.stop is None and self.agreed_stop:
            return None  # stopped with the others before its worker saw the request: rank 0 records it
        return self.attempt_end(state, f"{where}: {message}" if not chief and message else message)

    def attempt_end(self, state: JobState, message: str | None) -> AttemptEnd:
        """The attempt's end as the attempt protocol says it: the job's `state` and why."""
        return AttemptEnd(
            ending=ENDINGS[state],
            message=message,
            exit_code=self.returncode,
            crashed=self.crashed,
            out_of_memory=self.out_of_memory,
        )

    def verdict(self, fraction: float = 1.0) -> tuple[JobState, str | None]:
        """The job's state after this attempt (which held `fraction` of each GPU), and the
        reason to record with it. Out of memory on a shared GPU is tried once more on whole
        GPUs (the runner raises the job's fraction to 1): a neighbour may have taken the
        memory, or the slice was too small."""
        if self.trained and self.stop in TOO_LATE:
            return JobState.SUCCEEDED, None
        if self.session and self.stop in (Stop.IDLE, Stop.TIME_LIMIT):
            return JobState.SUCCEEDED, self.stop_message
        if self.session and self.stop == Stop.SHUTDOWN:
            return JobState.CANCELLED, f"{self.stop_message}: the session ended (its notebook folder is kept)"
        if self.stop in (Stop.SHUTDOWN, Stop.PREEMPT, Stop.RENDEZVOUS, Stop.FROZEN, Stop.NO_DOOR):
            return JobState.QUEUED, self.stop_message
        if self.stop == Stop.CANCEL:
            return JobState.CANCELLED, self.stop_message
        if self.stop == Stop.SWEEP:
            return JobState.SUCCEEDED, self.stop_message
        if self.stop == Stop.TIME_LIMIT:
            where = f"at step {self.step}" if self.step is not None else "before its first step"
            return JobState.FAILED, f"{self.stop_message} {where}"
        if self.stop in FAILING:
            return JobState.FAILED, self.stop_message
        if self.never_ran:
            said = next((line for line in reversed(self.last_stderr) if line.strip()), "")
            return JobState.QUEUED, f"the sandbox did not start ({said[-500:]}): queued again"
        if (self.done is not None or self.program) and self.returncode == 0:
            return JobState.SUCCEEDED, None
        if self.limits_hit:
            said = f"{self.error.get('message') or self.error.get('kind')}; " if self.error else ""
            return JobState.FAILED, f"{said}it reached its {' and '.join(self.limits_hit)} (towerq's limits)"
        if self.out_of_memory and fraction < 1.0:
            return JobState.QUEUED, (
                f"ran out of GPU memory on a shared GPU (fraction {fraction}): queued again for whole GPUs"
            )
        if self.peer_lost:  # the whole gang queues again and resumes from rank 0's checkpoint
            return JobState.QUEUED, str(self.error.get("message") if self.error else "") or "lost a rank"
        if self.error is not None:
            return JobState.FAILED, str(self.error.get("message") or self.error.get("kind"))
        if self.killed_from_outside or self.rank_died:
            return JobState.QUEUED, exit_message(self.returncode, self.last_stderr, self.who)
        return JobState.FAILED, exit_message(self.returncode, self.last_stderr, self.who)


RANK_ZERO_RECORDS = (Stop.CANCEL, Stop.SWEEP, Stop.PREEMPT, Stop.TIME_LIMIT, Stop.GPU_IDLE)
"""Stops every rank of a job over several hosts is asked for, whose end rank 0 records."""
ENDINGS: dict[JobState, Ending] = {
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.QUEUED: "queued",
}
"""A verdict as the attempt protocol says it."""
ASKED: dict[AskedStop, Stop] = {
    "cancel": Stop.CANCEL, "sweep": Stop.SWEEP, "preempt": Stop.PREEMPT, "gpu_idle": Stop.GPU_IDLE,
    "time_limit": Stop.TIME_LIMIT,
}  # fmt: skip
"""The stops towerq asks of an attempt (`AttemptStatus.stop`), as an outcome names them."""
TOO_LATE = frozenset({None, Stop.CANCEL, Stop.SWEEP, Stop.PREEMPT, Stop.SHUTDOWN, Stop.TIME_LIMIT, Stop.GPU_IDLE})
"""Stops that do not undo a trained job: asked after its last step, they change nothing it
made. A full folder, a bad spec or a GPU-memory breach still fail it."""
FAILING = frozenset({Stop.BAD_SPEC, Stop.FOLDER_FULL, Stop.GPU_MEMORY, Stop.GPU_IDLE, Stop.NOT_READY, Stop.CANNOT_HERE})
"""Stops that fail the job, their message its reason."""

ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
NATIVE_LINE = re.compile(
    r"^(?:([IWEF])\d{4} [\d:.]+ +\d+ |\d{4}-\d\d-\d\d [\d:.]+: ([IWEF]) |\[([IWEF])\d{4} [\d:.]+ )\S+:\d+\] "
)
"""A line of native logging, its level letter captured: absl's (TensorFlow, JAX, PyTorch's
Python side) `I1125 19:33:12.123 4242 port.cc:153]` (before absl is set up: `I0000
00:00:1795635917.2 ...`), TensorFlow's older `2026-11-25 19:33:12.123: W
tensorflow/...cc:153]`, or PyTorch's C++ `[W1206 21:29:30.183097557 socket.cpp:207]`."""
NATIVE_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "error"}


def _native_level(line: str) -> str | None:
    found = NATIVE_LINE.match(line)
    return NATIVE_LEVELS[found.group(1) or found.group(2) or found.group(3)] if found else None


def is_runtime_noise(line: str) -> bool:
    """TensorFlow's start-up chatter that escapes `TF_CPP_MIN_LOG_LEVEL=1` (warnings and up,
    as towerq's trainer is started) because it is written before absl's logging is set up:
    the banner that says so, and native INFO lines (the oneDNN and CPU-feature notices). Its
    warnings and errors are kept; a member's program keeps every line (its INFO lines are
    what it asked for)."""
    return line == ABSL_BANNER or _native_level(line) == "info"


PYTHON_WARNING = re.compile(r"^.+:\d+: \w*Warning: ")
"""A Python warning as `warnings` writes it: `train.py:12: UserWarning: ...`, then its
source line, indented."""
LEVEL_WORD = re.compile(r"^\[?(WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
"""A line that begins with its level in capitals: `logging`'s default format
(`WARNING:root:...`), pip's `ERROR: ...`, `[WARN] ...`."""
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
"""The line that ends a traceback: the exception (`ValueError: ...`, `KeyboardInterrupt`)."""
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def level_of(line: str) -> str:
    """The log level of a stderr line: native logging's levels, tracebacks, warnings, a
    level word in capitals at its start."""
    native = _native_level(line)
    if native is not None:
        return native
    head = line.split(":")[0]
    word = LEVEL_WORD.match(line)
    if "Traceback" in line or "Error" in head or (word and word.group(1) not in ("WARNING", "WARN")):
        return "error"
    if "Warning" in head or word or PYTHON_WARNING.match(line):
        return "warning"
    return "info"


class StderrLevels:
    """The levels of one stream's stderr lines, each in the light of the lines before it:
    every line of a traceback is an error, from its header through its frames (indented)
    to its exception and the chained ones; a Python warning's source line (indented) a
    warning. Else `level_of`. The processes of one job share its stderr, so a line of
    another process that comes into a traceback ends it."""

    def __init__(self) -> None:
        self.kept: str | None = None
        """The level the indented lines that follow keep: in a traceback, after a warning."""

    def __call__(self, line: str) -> str:
        if self.kept is not None and line[:1].isspace():
            return self.kept
        in_traceback, self.kept = self.kept == "error", None
        if line.startswith("Traceback (most recent call last)"):
            self.kept = "error"
            return "error"
        if line.startswith(CHAINED) or (in_traceback and EXCEPTION_LINE.match(line)):
            return "error"
        level = level_of(line)
        if PYTHON_WARNING.match(line):
            self.kept = "warning"
        return level


def exit_message(returncode: int | None, stderr: list[str], who: str = "trainer") -> str:
    said = next((line.strip() for line in reversed(stderr) if line.strip()), "")
    if returncode == pyenv.NOT_INSTALLED and said.startswith(pyenv.SAID):  # its build's word, not the program's
        return said.removeprefix("towerq: ")
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"{who} killed by {name}{hint}"
    # its last words: the last line that says something (a rule of `=` closes torchrun's summary)
    tail = next((line.strip() for line in reversed(stderr) if any(c.isalnum() for c in line)), "")
    return f"{who} exited with code {returncode}" + (f": {tail[-500:]}" if tail else "")
