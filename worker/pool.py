"""Warm trainers: trainer processes started ahead of their job, so a job starts training
without waiting for TensorFlow to load.

A warm trainer (`python -m worker.trainer --warm`) has imported TensorFlow, Keras and the
trainer but touched no device: it was started with `CUDA_VISIBLE_DEVICES` empty and learns
its GPUs with its job, before TensorFlow initialises any. It serves exactly one job and
ends with it, like a cold trainer: no state passes between jobs or users. The pool holds
`TOWERQ_TRAINER_POOL` of them (default 1; 0 turns warm trainers off) and warms the next
one in the background once the job that took one is training (or after `REFILL_AFTER_S`),
so loading TensorFlow for the next job does not compete with the start of this one.

In the sandbox (`worker.sandbox`) a trainer's view is fixed when bwrap starts it, before a
warm trainer's job is known. Every sandboxed trainer sees its job folder at `/job`, so a
warm one is started with a folder of its own (`<artifacts>/.warm/<host>-<id>`) shown there,
and the folder is renamed to the job's when a job takes it: the trainer, its working folder
and its paths are the same as a cold start's. A job's code bundle is seen at `/code`
(`sandbox.CODE_PATH`) by every sandboxed job, so a warm trainer is started with an empty
folder of its own shown there, read only, which the worker fills with the bundle's files
when a job with one takes it (a bind shows what is added to its folder later), before the
trainer reads its spec. Only a trainer that is ready is taken (until bwrap has set up its
view, its folders must not move), and only by a job whose view it can show: no uploaded
dataset, no GPU device nodes (real GPUs), no network, no input folders, and no folder yet
(a retry resumes in its own); the others start cold.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from service.core.settings import Settings
from worker import sandbox
from worker.disk import DiskError, JobDisk, open_for
from worker.disk_kind import in_use
from worker.launch import (
    REPO_ROOT,
    Launch,
    code_seen,
    protected_paths,
    sandbox_extras,
    sandbox_folder,
    seen_path,
    trainer_environment,
    trainer_user,
)
from worker.processes import kill_group

log = logging.getLogger(__name__)

REFILL_AFTER_S = 15.0
"""Warm the next trainer this long after a take even if the job has not reported training."""
WARM_LINE = b'"event": "warm"'
SLOTS = ".warm"
CODE_SLOT = ".code"
"""A warm trainer's code folder is its slot's name with this added."""


@dataclass
class WarmTrainer:
    process: subprocess.Popen[bytes]
    slot: Path | None
    """In the sandbox: its folder (seen as `/job`), which becomes the job's."""
    code: Path | None = None
    """In the sandbox: the folder it sees at `/code`, read only, filled with the job's code
    bundle when it is taken; removed when its attempt ends (`TrainerPool.release`)."""
    ready: bool = False
    """It has loaded TensorFlow and waits for its job."""
    disk: JobDisk | None = None
    """Its folder's disk where job folders are disk images (`worker.disk`), the job's once taken."""


class TrainerPool:
    """The warm trainers of one worker, kept by a thread of their own, which must outlive
    them and the jobs they take: a trainer dies with the thread that started it."""

    def __init__(self, settings: Settings, host: str, size: int, sandboxed: bool, simulated: bool) -> None:
        self.settings = settings
        self.size = size
        self.sandboxed = sandboxed
        self.simulated = simulated
        self.slots = settings.artifacts_dir.resolve() / SLOTS
        self.prefix = f"{host}-"
        self.warm: list[WarmTrainer] = []
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closed = threading.Event()
        self.taken_at: float | None = None
        self.thread = threading.Thread(target=self._keep, name=f"{host}-trainer-pool", daemon=True)

    # -- the worker's side ----------------------------------------------------------------

    def start(self) -> None:
        if self.size <= 0:
            return
        self._clear_slots()
        self.thread.start()

    def stop_warming(self) -> None:
        """No more warm trainers started or given out (the worker is stopping)."""
        self.closed.set()
        self.wake.set()

    def close(self) -> None:
        """End the pool's thread and every warm trainer (end of input first, then SIGKILL),
        and remove their folders. Only once no taken trainer runs: the kernel kills every
        process the thread started when it ends (`PR_SET_PDEATHSIG`, `--die-with-parent`)."""
        self.stop_warming()
        if self.thread.is_alive():
            self.thread.join(30)
        with self.lock:
            left, self.warm = self.warm, []
        for trainer in left:
            self._discard(trainer)
        self._clear_slots()

    def ready(self) -> int:
        with self.lock:
            return sum(1 for t in self.warm if t.ready and t.process.poll() is None)

    def take(self, launch: Launch, folder: Path, disk: JobDisk | None = None) -> WarmTrainer | None:
        """A warm trainer for this attempt, with `folder` its job folder (in the sandbox, the
        trainer's own folder renamed to it, or its disk moved to `disk`, which the attempt
        holds), or None when the job must start cold."""
        if self.size <= 0 or self.closed.is_set() or not self.fits(launch, folder):
            return None
        with self.lock:
            alive = [t for t in self.warm if t.process.poll() is None]
            for dead in (t for t in self.warm if t not in alive):
                self._discard(dead)
            alive.sort(key=lambda t: not t.ready)  # one that is ready first
            self.warm = alive
            # In the sandbox only a ready one: until bwrap has set up its view, the folder it
            # binds must not move (renamed away early, the trainer finds its folder missing).
            usable = [t for t in alive if t.ready or not self.sandboxed]
            if not usable:
                return None
            trainer = usable[0]
            self.warm = [t for t in alive if t is not trainer]
            self.taken_at = time.monotonic()
        bundle = code_seen(launch, self.settings)
        if trainer.code is not None and bundle is not None:
            try:
                fill_code(bundle, trainer.code)
            except OSError as err:
                log.warning(
                    "could not show job %s its code in a warm trainer (%s): starting one cold", launch.job_id, err
                )
                self._discard(trainer)
                return None
        if trainer.slot is not None:
            folder.parent.mkdir(parents=True, exist_ok=True)
            if trainer.disk is None and disk is None:
                trainer.slot.rename(folder)
                return trainer
            try:
                if trainer.disk is None or disk is None:  # the trainer sees its folder, not what is mounted on it later
                    raise DiskError("the warm trainer's folder and the job's are not both disks")
                trainer.disk.move_to(disk)
            except DiskError as err:
                log.warning("job %s starts cold: %s", launch.job_id, err)
                self._discard(trainer)
                return None
            self._remove_slot(trainer.slot)  # empty: its disk is the job's folder now
        return trainer

    def release(self, trainer: WarmTrainer) -> None:
        """A taken trainer's attempt is over: its code folder goes (its slot is the job's folder)."""
        self._remove_slot(trainer.code)

    def _discard(self, trainer: WarmTrainer) -> None:
        """A trainer that serves no job: ended, and both its folders (and its disk) removed."""
        end(trainer.process)
        if trainer.disk is not None:
            trainer.disk.drop()
        self._remove_slot(trainer.slot)
        self._remove_slot(trainer.code)

    def refill(self) -> None:
        """The job that took a warm trainer is training (or over): warm the next one now."""
        self.taken_at = None
        self.wake.set()

    def fits(self, launch: Launch, folder: Path) -> bool:
        """Whether this job may take a warm trainer (in the sandbox: its view is every job's)."""
        if not self.sandboxed:
            return True
        datasets, _ = sandbox_extras(launch, self.settings)  # a code bundle is shown at /code when taken
        network = bool(launch.spec.get("network"))
        plain = not datasets and not network and not launch.inputs
        return launch.simulated and plain and not folder.exists()

    # -- the pool's thread ----------------------------------------------------------------

    def _keep(self) -> None:
        while not self.closed.is_set():
            try:
                self._top_up()
                self._await_warm_lines()
            except Exception:
                log.exception("the trainer pool failed; trying again")
                self.closed.wait(5.0)

    def _top_up(self) -> None:
        taken_at = self.taken_at
        if taken_at is not None and time.monotonic() - taken_at < REFILL_AFTER_S:
            return  # the job that took the last one is still starting: leave it the cores
        with self.lock:
            for dead in [t for t in self.warm if t.process.poll() is not None]:
                self._discard(dead)
                self.warm.remove(dead)
            missing = self.size - len(self.warm)
        for _ in range(missing):
            trainer = self._spawn()
            with self.lock:
                if self.closed.is_set():
                    end(trainer.process)
                    return
                self.warm.append(trainer)

    def _await_warm_lines(self) -> None:
        """Wait (a while) for the starting trainers' `warm` lines, or a wake-up."""
        with self.lock:
            starting = [t for t in self.warm if not t.ready and t.process.poll() is None]
        if not starting:
            self.wake.wait(1.0)
            self.wake.clear()
            return
        with selectors.DefaultSelector() as selector:
            for trainer in starting:
                assert trainer.process.stdout is not None
                selector.register(trainer.process.stdout, selectors.EVENT_READ, trainer)
            for key, _ in selector.select(timeout=0.5):
                trainer = key.data
                with self.lock:  # a trainer taken meanwhile: what it prints is its runner's
                    if trainer in self.warm and _read_line(key.fd).find(WARM_LINE) >= 0:
                        trainer.ready = True

    def _spawn(self) -> WarmTrainer:
        command = [sys.executable, "-m", "worker.trainer", "--warm", str(self.settings.trainer_nice)]
        slot = code = disk = None
        if self.sandboxed:
            slot = self.slots / f"{self.prefix}{uuid.uuid4().hex[:12]}"
            slot.mkdir(parents=True)
            code = slot.with_name(slot.name + CODE_SLOT)
            code.mkdir(mode=0o755)  # the worker's: the trainer only reads it
            identity = trainer_user(self.settings)
            sandbox.hand_over(slot, identity)
            if in_use(self.settings):
                disk = open_for(slot, self.settings)  # before bwrap shows the folder
            command = sandbox.bwrap_command(
                command,
                job_folder=slot,
                repo_root=REPO_ROOT,
                models_path=self.settings.models_path,
                data_dir=self.settings.data_dir,
                datasets=[],
                code_path=code,
                devices=[],
                identity=identity,
                protected=protected_paths(self.settings),
                tmp_mb=self.settings.trainer_tmp_mb,
                own_folder=sandbox_folder(self.settings),
            )
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=trainer_environment([], self.settings.trainer_env_pass),
            cwd=slot or self.settings.artifacts_dir.resolve().parent,
            start_new_session=True,
        )
        return WarmTrainer(process, slot, code, disk=disk)

    def _clear_slots(self) -> None:
        if self.slots.is_dir():
            for slot in self.slots.glob(f"{self.prefix}*"):
                self._remove_slot(slot)

    @staticmethod
    def _remove_slot(slot: Path | None) -> None:
        if slot is not None:
            shutil.rmtree(slot, ignore_errors=True)


def fill_code(bundle: Path, folder: Path) -> None:
    """Put a code bundle's files (`bundle`, towerq's own unpacked copy: no links in it) into
    a warm trainer's empty code folder, as hard links where the two share a filesystem (a
    bundle's files are read only), else as copies. Links are never followed, nor made."""
    for root, folders, files in os.walk(bundle):
        target = folder / Path(root).relative_to(bundle)
        for name in folders:
            (target / name).mkdir(mode=0o755)
        for name in files:
            source = Path(root) / name
            if source.is_symlink():
                continue
            try:
                os.link(source, target / name, follow_symlinks=False)
            except OSError:
                shutil.copyfile(source, target / name, follow_symlinks=False)
                (target / name).chmod(0o644)


def _read_line(fd: int) -> bytes:
    """One line from a warm trainer's stdout, a byte at a time: nothing after it may be read
    here, since the rest belongs to the job's runner."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line


def hand_over(trainer: WarmTrainer, spec_path: Path, env: dict[str, str]) -> bool:
    """Give a warm trainer its job: the spec file and working folder as it sees them, and the
    job's GPUs. False when it can no longer take one (it died warming): start one cold."""
    seen = seen_path(spec_path, sandboxed=trainer.slot is not None)
    gpus = {"CUDA_VISIBLE_DEVICES": env["CUDA_VISIBLE_DEVICES"]}
    job = {"spec": str(seen), "cwd": str(seen.parent), "env": gpus}
    assert trainer.process.stdin is not None
    try:
        trainer.process.stdin.write(json.dumps(job).encode() + b"\n")
        trainer.process.stdin.close()
    except OSError as err:
        log.warning("warm trainer %s could not take its job (%s): starting one cold", trainer.process.pid, err)
        end(trainer.process)
        return False
    return True


def end(process: subprocess.Popen[bytes]) -> bool:
    """End a warm trainer that has no job: end of input, then SIGKILL to its group. False,
    for use in filters."""
    try:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(timeout=2.0)
    except (OSError, subprocess.TimeoutExpired):
        pass
    kill_group(process.pid)
    process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    return False
