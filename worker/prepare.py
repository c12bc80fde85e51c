"""Queued jobs' requirements, built on a host before the jobs start (`TOWERQ_ENVS_PREPARE`).

A command job or notebook session that names `requirements` builds its Python environment
on its host first (`worker.pyenv`), and its GPUs are held meanwhile: minutes, for a large
list the first time on a host, and a sweep's trials that land together all wait for the
one that builds. A job that waits in the queue has that time to spare: its host builds the
environment while it waits, and the job finds it ready ("its requirements are installed on
this host already").

Which lists: those of the queued jobs that wait (the scheduler gave a reason: a job it can
place at once builds its own, its log showing pip's lines), not on hold, that could start
here (asking for this host or none, and expected by the scheduler's forecast here, or where
it cannot say, `expected_host`; a job larger than this host, which runs over several, on
every host: the forecast names its first), in queue order; the first `envs_max // 2`
different ones, so that they do not push each other (or what running jobs use) out of the
`TOWERQ_ENVS_MAX` a host keeps. One build at a time, by the process an attempt runs
first, given no command (`python -I -m worker.pyenv ... --`: it builds, or finds, and
ends), as the worker's user, outside any sandbox, with what pip is told in an attempt; its
lines go to the worker's log. It dies with the worker (PR_SET_PDEATHSIG, and its process
group is killed at the stop).

Each waiting job's log says how its list went on this host, once (a line of towerq's,
`service.core.joblog.towerq_lines`): installed while it waits, or not, with pip's reason.
A list pip cannot install is not tried again on this host for `FAILED_AGAIN_S`, and fails
no job: the index may be away for a moment, and a sweep's hundred queued trials would fail
with it; its jobs' logs warn at once (a member who made a typo cancels and submits again,
not hours later), and a job says pip's reason when it starts, as it did before."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from service.core import joblog
from service.core.context import Context
from service.core.lifetime import dies_with_this_process
from service.core.models import Job, JobState
from towerq.contract.times import span_text
from worker import pyenv
from worker.processes import signal_group

log = logging.getLogger(__name__)

POLL_S = 5.0
"""How often the queue is read for a list to build (a build, once started, runs to its end)."""
FREE_PCT_KEPT = 15
"""No build ahead where the environments' disk has less free (of its size): what is built
ahead is optional, and yields to the running jobs, whose folders' images are sparse files
in the same `TOWERQ_VAR_DIR` (`worker.disk.disks_of`). Kubernetes' kubelet draws its line
there for the same kind of thing (a node's images go once its disk passes 85 % used)."""
FAILED_AGAIN_S = 600.0
"""How long a list pip could not install is left before this host tries it again."""


def mark_failed_on(session: Session, job_ids: list[int], host: str, failed: bool) -> None:
    """`host` on (or off) the jobs' `requirements_failed_on`, which their reason says; the
    rows locked, as other hosts mark the same jobs."""
    rows = session.execute(
        select(Job.id, Job.requirements_failed_on).where(Job.id.in_(job_ids)).with_for_update()
    ).all()
    for job_id, hosts in rows:
        marked = sorted({*(hosts or ()), host} if failed else set(hosts or ()) - {host})
        if marked != (hosts or []):
            session.execute(update(Job).where(Job.id == job_id).values(requirements_failed_on=marked or None))


def queued_lists(ctx: Context, host: str, gpus: int, most: int) -> list[tuple[list[str], list[int]]]:
    """The first `most` different requirement lists of the waiting jobs that could start on
    `host` (which has `gpus`), in queue order, each with the ids of those jobs that name it."""
    with ctx.db.read() as session:
        rows = session.execute(
            select(Job.id, Job.spec["requirements"])  # not whole specs: every waiting job's list is read
            .where(
                Job.state == JobState.QUEUED,
                Job.pending_reason.is_not(None),
                Job.on_hold_by.is_(None),
                Job.spec["requirements"].is_not(None),
                or_(Job.requested_host.is_(None), Job.requested_host == host),
                or_(Job.expected_host.is_(None), Job.expected_host == host, Job.gpu_count > gpus),
            )
            .order_by(Job.queue_position.is_(None), Job.queue_position, Job.id)
        )
        lists: dict[tuple[str, ...], list[int]] = {}
        for job_id, listed in rows:
            requirements = tuple(listed or ())
            if requirements and (requirements in lists or len(lists) < most):
                lists.setdefault(requirements, []).append(job_id)
    return [(list(requirements), ids) for requirements, ids in lists.items()]


class EnvPreparer:
    """The loop of one host's worker that builds its queued jobs' environments."""

    def __init__(self, ctx: Context, host: str, gpus: int, stopping: threading.Event) -> None:
        self.ctx = ctx
        self.host = host
        self.gpus = gpus
        self.stopping = stopping
        self.failed: dict[str, tuple[float, str]] = {}
        """The keys of lists pip could not install here: when (monotonic), and pip's reason."""
        self.told: dict[tuple[str, bool], set[int]] = {}
        """The jobs told of the build of each list, built or failed: each is told once."""
        self.short = False
        """Whether the environments' disk had too little room at the last look."""
        self.process: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stopping.wait(POLL_S):
            try:
                self.prepare_next()
            except Exception:
                log.exception("worker %s: building a queued job's requirements failed", self.host)

    def prepare_next(self) -> list[str] | None:
        """Build the first list of `queued_lists` not ready here (nor failed of late); it.
        Its jobs' logs say how it went, once each (so do those of jobs that come to wait on
        a list that failed of late)."""
        settings = self.ctx.settings
        root = pyenv.root_of(settings.var_dir)
        now = time.monotonic()
        lists = [
            (pyenv.env_key(requirements, settings.pip_options), requirements, job_ids)
            for requirements, job_ids in queued_lists(self.ctx, self.host, self.gpus, max(1, settings.envs_max // 2))
        ]
        self.forget_told({key: job_ids for key, _, job_ids in lists})
        for key, requirements, job_ids in lists:
            if (root / key / pyenv.READY).is_file():
                continue
            if key in self.failed and now - self.failed[key][0] < FAILED_AGAIN_S:
                self.tell(key, job_ids, False, self.failed_line(self.failed[key][1]))
                continue
            if self.disk_short(root):
                return None
            started = time.monotonic()
            built, said = self.build(requirements)
            if self.stopping.is_set():
                return requirements
            if built:
                self.failed.pop(key, None)
                took = f"{span_text(time.monotonic() - started)}, environment {key[:12]}"
                self.tell(key, job_ids, True, f"its requirements were installed on {self.host} while it waits ({took})")
            else:
                self.failed[key] = (time.monotonic(), said)
                self.tell(key, job_ids, False, self.failed_line(said))
            return requirements
        return None

    def disk_short(self, root: Path) -> bool:
        """Whether the environments' disk has less than `FREE_PCT_KEPT` free: no build ahead
        then (the worker's log says so once), as the running jobs' folders may need the room;
        a job that starts builds its own."""
        usage = shutil.disk_usage(next(path for path in (root, *root.parents) if path.exists()))
        short = usage.free < usage.total * FREE_PCT_KEPT / 100
        if short and not self.short:
            log.warning(
                "worker %s: no queued job's requirements built here while %s has less than %d%% free (%.1f GB): "
                "the running jobs may need the room",
                self.host,
                root,
                FREE_PCT_KEPT,
                usage.free / 1e9,
            )
        elif self.short and not short:
            log.info("worker %s: %s has room again: queued jobs' requirements are built here", self.host, root)
        self.short = short
        return short

    def failed_line(self, reason: str) -> str:
        return (
            f"its requirements could not be installed on {self.host} while it waits: {reason}. Unless that changes "
            f"({self.host} tries again in {span_text(FAILED_AGAIN_S)}), it fails with this reason when it starts "
            "there: cancel it and submit it with requirements pip can install"
        )

    def tell(self, key: str, job_ids: list[int], built: bool, message: str) -> None:
        """`message` in the log of each of `job_ids` not told yet how the build of `key` went."""
        told = self.told.setdefault((key, built), set())
        new = [job_id for job_id in job_ids if job_id not in told]
        if new:
            with self.ctx.db.write() as session:
                rows = joblog.towerq_lines(session, new, "info" if built else "warning", message)
                mark_failed_on(session, new, self.host, not built)
            joblog.append_rows(self.ctx.settings.artifacts_dir, rows)
            told.update(new)

    def forget_told(self, waiting: dict[str, list[int]]) -> None:
        """Keep in `told` only the jobs that still wait on each list (all of a list's are in
        `waiting` while the list is)."""
        for key, built in list(self.told):
            self.told[key, built] &= set(waiting.get(key, ()))
            if not self.told[key, built]:
                del self.told[key, built]

    def build(self, requirements: list[str]) -> tuple[bool, str]:
        """`worker.pyenv` with no command, to its end (or the worker's stop): built, and if
        not, why."""
        settings = self.ctx.settings
        words, environment = pyenv.prefix(settings.var_dir, requirements, settings.pip_options, settings.envs_max, {})
        log.info("worker %s: building queued jobs' requirements: %s", self.host, " ".join(requirements))
        with self.lock:
            if self.stopping.is_set():
                return False, "the worker stops"
            self.process = subprocess.Popen(
                words,  # ending in `--`: no command
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # pip with it, for the stop's kill
                preexec_fn=dies_with_this_process(),  # tied to this loop's thread, which ends at the stop
            )
        process = self.process
        assert process.stdout is not None
        last = ""
        for line in process.stdout:
            if text := line.rstrip():
                last = text
                log.log(logging.DEBUG if text.startswith("pip: ") else logging.INFO, "worker %s: %s", self.host, text)
        code = process.wait()
        with self.lock:
            self.process = None
        if code == 0:
            return True, last
        said = last.removeprefix(pyenv.SAID) if code == pyenv.NOT_INSTALLED else f"its build exited with code {code}"
        if not self.stopping.is_set():
            log.warning(
                "worker %s: the requirements of queued jobs could not be installed here (%s): not tried again here "
                "for %.0f min; the jobs' logs say so",
                self.host,
                said,
                FAILED_AGAIN_S / 60,
            )
        return False, said

    def stop(self) -> None:
        """End the build under way, pip with it (the folder it left is built again next time)."""
        with self.lock:
            if self.process is not None:
                signal_group(self.process.pid, signal.SIGKILL)  # its session's group: pip with it
