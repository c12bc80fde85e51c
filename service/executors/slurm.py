"""The Slurm executor: each attempt of a towerq job is one Slurm batch job, and Slurm
decides where and when it runs (`TOWERQ_EXECUTOR=slurm`).

- submit: `sbatch` of a job named `<prefix>-<job>-<attempt>` asking for the job's GPUs as
  gres (`--gres=gpu:N`), in the partition and account the admin set, never requeued by
  Slurm itself (`--no-requeue`: towerq owns retries, so a crash counts against the job's
  `max_attempts` once, and the next attempt resumes from its checkpoint). Its batch script
  runs `python -m worker.slurm <job> <attempt>` on the node Slurm picks: towerq's trainer
  on the GPUs in Slurm's `CUDA_VISIBLE_DEVICES`, reporting to the API (`TOWERQ_API_URL`)
  with the attempt's own token, never with the database's or Redis' credentials: the batch
  script's environment is the scheduler's without them (`batch_environment`).
- observe: one `squeue --me --states=all` shared by every attempt for a moment (the pass
  asks about each holding job): Slurm's state, its reason and expected start
  (`squeue --start`'s figure) for a pending job, and how the cluster ended one.
- stop: a cancel of an attempt Slurm still holds pending is `scancel`; a running attempt's
  runner reads the stop from the job's row within a second, checkpoints and ends.
- hold: `scontrol hold` of a pending attempt's Slurm job (`towerq hold`), then `squeue` to
  see that it is still pending; `scontrol release` lets it start again.
- capacity: the nodes `sinfo` lists in the partition, up, and the GPUs each has as gres.
- runs_on: the node `squeue` says the attempt's Slurm job runs on (the API takes an
  attempt's claim of that node only): the shared snapshot where it confirms the claim,
  else asked afresh.

Slurm's own commands, not slurmrestd: they are on every node that can submit, need no
token and no extra daemon, and their output formats are stable across releases, where the
REST API's version changes with each one (v0.0.38 in 22.05, v0.0.40 later).
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import subprocess
import sys
import threading
import time
from fnmatch import fnmatchcase
from pathlib import Path

from sqlalchemy.orm import Session

from service.core.settings import Settings
from service.core.slurm_nodes import address_command, parse_address
from service.executors.base import Attempt, Capacity, ExecutorError, Seen
from service.executors.slurm_cpus import CpuView, NodeRow, partitions_used, share_per_gpu, slurm_sets_cpus_per_gpu
from service.executors.slurm_words import (
    DOWN,
    HELD_STATES,
    SINFO_FORMAT,
    SQUEUE_FORMAT,
    SlurmJob,
    ended,
    expected_start,
    parse_nodes,
    parse_squeue,
    pending_reason,
)
from towerq.contract.messages import CancelMessage, StopMessage

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_TTL_S = 2.0
"""How long one `squeue` answers for every attempt (a pass observes each holding job)."""
CLUSTER_TTL_S = 60.0
"""How long what `sinfo` and `scontrol` said of the nodes' CPUs and the partitions' defaults
answers for every submit (an admin's change shows within it)."""
FRESH_S = 0.5
"""How old an `squeue` may be and still count as asked afresh (a claim Slurm's older word
does not confirm)."""
COMMAND_TIMEOUT_S = 30.0
TRANSIENT = (
    "unable to contact slurm controller", "socket timed out", "try again", "timed out", "temporarily",
    "submit limit", "maxsubmitjob",
)  # fmt: skip
"""Words of a Slurm failure that asking again may cure (the controller restarting, a QOS's
limit on submitted jobs)."""


class SlurmError(ExecutorError):
    """A Slurm command failed; its message is Slurm's."""


def job_name(prefix: str, job_id: int, attempt: int) -> str:
    return f"{prefix}-{job_id}-{attempt}"


def time_limit_minutes(attempt_limit_s: int | None, grace_s: float) -> int | None:
    """Slurm's limit for an attempt: towerq's own (which stops the trainer with a
    checkpoint and records the end) plus the grace and a minute, so that Slurm's is the
    backstop, never the one that fires first."""
    if attempt_limit_s is None:
        return None
    return max(1, math.ceil((attempt_limit_s + grace_s + 60) / 60))


class SlurmExecutor:
    name = "slurm"
    places_jobs = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.prefix = settings.slurm_job_prefix
        self._lock = threading.Lock()
        self._snapshot: dict[str, list[SlurmJob]] = {}
        self._read_at = -math.inf
        self._cpu_view: CpuView = CpuView([], set(), slurms_own=False)
        self._cpu_view_at = -math.inf
        self._cpu_view_lock = threading.Lock()  # not the snapshot's: asking Slurm takes a moment

    # -- the calls (service.executors.base) -------------------------------------------

    def submit(self, attempt: Attempt) -> None:
        """`sbatch` the attempt; raises SlurmError with Slurm's words when it refuses."""
        if attempt.token is None:
            raise SlurmError(f"job {attempt.job_id} attempt {attempt.attempt} has no attempt token", lasting=True)
        environment = batch_environment(_slurm_environment(), attempt.token, self.settings.api_url)
        command = self.sbatch_command(attempt, self.cpus_per_task(attempt))
        slurm_id = self._run(command, environment).strip().split(";")[0]
        log.info("job %s attempt %s is Slurm job %s", attempt.job_id, attempt.attempt, slurm_id)
        with self._lock:
            self._read_at = -math.inf  # the next observe sees it

    def observe(self, attempt: Attempt) -> Seen:
        """Raises SlurmError when Slurm cannot be asked (then nothing is concluded)."""
        job = self.newest(job_name(self.prefix, attempt.job_id, attempt.attempt))
        if job is None:
            return Seen(held=False)
        if job.state in HELD_STATES:
            expected = expected_start(job)
            return Seen(
                held=True,
                reason=pending_reason(job),
                expected_start=expected,
                expected_host=job.node if expected is not None else None,
            )
        return Seen(held=False, ended=ended(job, self.settings.slurm_log_dir))

    def stop(self, message: StopMessage) -> None:
        if isinstance(message, CancelMessage):
            name = job_name(self.prefix, message.job_id, message.attempt)
            try:
                self._run(["scancel", "--me", "--state=PENDING", f"--name={name}"])
            except SlurmError as err:
                log.warning("scancel of %s failed: %s", name, err)
        with self._lock:
            self._read_at = -math.inf

    def hold(self, attempt: Attempt, held: bool) -> None:
        name = job_name(self.prefix, attempt.job_id, attempt.attempt)
        self._run(["scontrol", "hold" if held else "release", f"jobname={name}"])
        with self._lock:
            self._read_at = -math.inf
        if not held:
            return
        job = self.newest(name)  # a hold of a running job only sets its priority to 0
        if job is None or job.state != "PENDING":
            state = "gone" if job is None else job.state.lower()
            if job is not None:
                self._run(["scontrol", "release", f"jobname={name}"])
            raise SlurmError(f"Slurm job {job.id if job else name} is {state}: only a pending job is held")

    def retime(self, attempt: Attempt) -> None:
        """The attempt's Slurm job takes the new limit (`time_limit_minutes`, the backstop
        behind towerq's own): `scontrol update TimeLimit=`. Slurm lets the job's user shorten
        it; lengthening takes a Slurm operator or admin (SlurmError, in Slurm's words,
        where towerq's Slurm user is not one)."""
        name = job_name(self.prefix, attempt.job_id, attempt.attempt)
        job = self.newest(name, FRESH_S)
        if job is None:
            raise SlurmError(f"Slurm has no job named {name}")
        minutes = time_limit_minutes(attempt.time_limit_s, self.settings.cancel_grace_s)
        limit = "UNLIMITED" if minutes is None else str(minutes)
        self._run(["scontrol", "update", f"JobId={job.id}", f"TimeLimit={limit}"])
        with self._lock:
            self._read_at = -math.inf

    def capacity(self, session: Session) -> dict[str, Capacity]:
        try:
            rows = self._sinfo()
        except SlurmError as err:
            log.warning("sinfo failed: %s", err)
            return {}
        nodes: dict[str, Capacity] = {}
        for row in rows:
            if row.gpus and row.state.rstrip("*~#!%$@^-") not in DOWN and row.node not in nodes:
                nodes[row.node] = Capacity(gpus=tuple(range(row.gpus)), smallest_gpu_mb=None)
        return nodes  # sinfo lists a node once per partition: the first counts

    def runs_on(self, job_id: int, attempt: int, claimed: str | None = None) -> str | None:
        """The node Slurm runs the attempt's Slurm job on: the shared snapshot's word where it
        names `claimed`, else asked afresh (a claim comes the moment its job starts), at most
        once a `FRESH_S` for every claim together, so that many attempts starting at once
        cost Slurm's controller a few `squeue`s, not one each. Raises SlurmError: lasting
        where Slurm does not run it (no such job, pending, ended), passing where Slurm cannot
        be asked."""
        name = job_name(self.prefix, job_id, attempt)
        try:
            job = self.newest(name)
            if job is None or job.state != "RUNNING" or job.node != claimed:
                job = self.newest(name, FRESH_S)
        except SlurmError as err:
            raise SlurmError(str(err)) from err  # whatever it said, asking again later may do
        if job is None:
            raise SlurmError(f"Slurm has no job named {name}", lasting=True)
        if job.state != "RUNNING" or not job.node:
            raise SlurmError(f"Slurm job {job.id} ({name}) is {job.state.lower()}, not running", lasting=True)
        return job.node

    def reach(self, node: str) -> str:
        """`node`'s address as Slurm says it (`NodeAddr`; its name where Slurm gives none).
        Raises SlurmError where Slurm cannot be asked."""
        return parse_address(self._run(address_command(node)), node) or node

    def cpus_per_task(self, attempt: Attempt) -> int | None:
        """The CPUs an attempt's one task asks for (service/executors/slurm_cpus.py says
        which); None: none, Slurm's default. Raises SlurmError when Slurm cannot be asked."""
        per_gpu = self.settings.slurm_cpus_per_gpu
        if per_gpu is None:
            view = self.cpu_view()
            per_gpu = None if view.slurms_own else share_per_gpu(view.rows, view.used, attempt.host)
        return per_gpu * max(1, attempt.gpu_count) if per_gpu else None

    def cpu_view(self) -> CpuView:
        """What the cluster says of its nodes' CPUs and its own default per GPU, read at
        most once a `CLUSTER_TTL_S` for every submit."""
        with self._cpu_view_lock:
            if time.monotonic() - self._cpu_view_at > CLUSTER_TTL_S:
                self._cpu_view, self._cpu_view_at = self._read_cpu_view(), time.monotonic()
            return self._cpu_view

    def _read_cpu_view(self) -> CpuView:
        rows = self._sinfo()
        used = partitions_used(rows, self.settings.slurm_partition)
        try:
            partitions = self._run(["scontrol", "show", "partition", "--oneliner"])
            slurms_own = slurm_sets_cpus_per_gpu(partitions, self._run(["scontrol", "show", "config"]), used)
        except SlurmError as err:  # no job fails for it: asking the share is safe
            log.warning("scontrol failed, so towerq asks the nodes' share of CPUs: %s", err)
            slurms_own = False
        return CpuView(rows, used, slurms_own)

    # -- what they say to Slurm -----------------------------------------------------------

    def sbatch_command(self, attempt: Attempt, cpus: int | None = None) -> list[str]:
        settings = self.settings
        name = job_name(self.prefix, attempt.job_id, attempt.attempt)
        log_dir = settings.slurm_log_dir.resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
        python = settings.slurm_python or sys.executable
        command = [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--gres=gpu:{max(1, attempt.gpu_count)}",
            "--ntasks=1",
            *([f"--cpus-per-task={cpus}"] if cpus else []),
            "--no-requeue",
            "--export=ALL",
            f"--chdir={REPO_ROOT}",
            f"--output={log_dir}/{name}-%j.out",
        ]
        if settings.slurm_partition:
            command.append(f"--partition={settings.slurm_partition}")
        if settings.slurm_account:
            command.append(f"--account={settings.slurm_account}")
        if attempt.host:
            command.append(f"--nodelist={attempt.host}")
        minutes = time_limit_minutes(attempt.time_limit_s, settings.cancel_grace_s)
        if minutes is not None:
            command.append(f"--time={minutes}")
        script = f"exec {shlex.quote(python)} -m worker.slurm {attempt.job_id} {attempt.attempt}"
        return [*command, f"--wrap={script}"]

    def newest(self, name: str, max_age_s: float = SNAPSHOT_TTL_S) -> SlurmJob | None:
        """The newest Slurm job named `name` (a resubmission's) in a snapshot at most
        `max_age_s` old; None where Slurm knows none."""
        jobs = self.snapshot(max_age_s).get(name)
        return max(jobs, key=lambda j: j.id) if jobs else None

    def snapshot(self, max_age_s: float = SNAPSHOT_TTL_S) -> dict[str, list[SlurmJob]]:
        """towerq's Slurm jobs by name, as one `squeue` saw them at most `max_age_s` ago
        (shared for a moment)."""
        with self._lock:
            if time.monotonic() - self._read_at > max_age_s:
                self._snapshot = self._squeue()
                self._read_at = time.monotonic()
            return self._snapshot

    def _sinfo(self) -> list[NodeRow]:
        command = ["sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"]
        if self.settings.slurm_partition:
            command.append(f"--partition={self.settings.slurm_partition}")
        return parse_nodes(self._run(command))

    def _squeue(self) -> dict[str, list[SlurmJob]]:
        out = self._run(["squeue", "--me", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"])
        return parse_squeue(out, self.prefix)

    def _run(self, command: list[str], environment: dict[str, str] | None = None) -> str:
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                env=environment or _slurm_environment(),
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SlurmError(f"{command[0]}: {err}") from err
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip()[:500]
            said = said if said.startswith(f"{command[0]}: ") else f"{command[0]}: {said}"
            raise SlurmError(said, lasting=not any(w in said.lower() for w in TRANSIENT))
        return result.stdout


def _slurm_environment() -> dict[str, str]:
    return {**os.environ, "SLURM_TIME_FORMAT": "%s"}


NOT_FOR_NODES = (
    "*DATABASE*", "*REDIS*", "PG*", "*PASSWORD*", "*PASSWD*", "*SECRET*", "*TOKEN*", "*CREDENTIAL*",
    "*WEBHOOK*", "*_KEY", "*_KEY_*",
)  # fmt: skip
"""What of the scheduler's environment a batch script never gets (`--export=ALL` passes the
rest): the database's and Redis' addresses and passwords, tokens, secrets, webhooks."""
TOKEN_VARIABLE = "TOWERQ_ATTEMPT_TOKEN"
"""Where the batch script finds its attempt's token (`worker.slurm` takes it out at once)."""


def batch_environment(environ: dict[str, str], token: str, api_url: str) -> dict[str, str]:
    """The environment `sbatch` runs with and the batch script inherits: the scheduler's
    (towerq's settings, Slurm's, PATH) without any credential, with the API's address and
    the attempt's own token."""
    kept = {
        name: value
        for name, value in environ.items()
        if not any(fnmatchcase(name.upper(), pattern) for pattern in NOT_FOR_NODES)
    }
    return {**kept, "TOWERQ_API_URL": api_url, TOKEN_VARIABLE: token}
