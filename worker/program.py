"""A command job: a member's own program (`"command": [...]` in its spec) run as an attempt.

It runs where a trainer runs: its own session and cgroups, the same sandbox (its code
bundle's folder is its working directory, read only), its GPUs in `CUDA_VISIBLE_DEVICES`.
What towerq gives it is in its environment (docs/command-jobs.md):

- `TOWERQ_JOB_ID`, `TOWERQ_ATTEMPT`;
- `TOWERQ_CHECKPOINT_DIR`: kept across the job's attempts, the job's own;
- `TOWERQ_OUTPUT_DIR`: what is there at the end is downloadable with the job's artifacts;
- `TOWERQ_DATA_DIR`: its dataset (an upload, read only), when it names one;
- `TOWERQ_INPUTS`: the folders of the jobs it waited for (`after`), as JSON {job id: path};
- `TOWERQ_METRICS_LOG`: where `towerq.report()` keeps its points for a resumed attempt;
- `TOWERQ_SIGNAL`: the warning it asked for (`USR1@600`: SIGUSR1 600 s before its time
  limit, `towerq.contract.signals`), when it asked for one;
- the framework hints for its GPU memory share (`TF_FORCE_GPU_ALLOW_GROWTH`,
  `PYTORCH_CUDA_ALLOC_CONF`, `XLA_PYTHON_CLIENT_MEM_FRACTION`).

It speaks the trainer's protocol on stdout only for what a program may say: `metric`,
`eval` and `log` lines (`towerq.report()` writes them). A `started`, `done`, `stopped` or
`error` line is the trainer's word; from a program it is kept as plain text. It succeeds
when it exits 0.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from service.core.lifetime import dies_with_this_process
from service.core.settings import Settings
from towerq.contract import events
from towerq.contract.signals import limit_signal
from towerq.contract.times import limit_text
from worker import gang, pyenv, sandbox
from worker.attempt import AttemptRunner, Starter
from worker.cgroups import AttemptGroup
from worker.inventory import GpuState
from worker.launch import (
    REPO_ROOT,
    Launch,
    code_seen,
    in_sandbox,
    input_paths,
    start_trainer,
    trainer_environment,
    trainer_user,
)
from worker.outcome import Stop
from worker.processes import signal_program
from worker.relay import program_metrics_log

CHECKPOINTS = "checkpoints"
OUTPUT = "output"
PROGRAM_SITE = Path(__file__).resolve().parent / "program_site"
"""Where a command job's Python processes find `sitecustomize` (each line written whole)."""
WORK = "work"
"""The program's working folder in the job's folder: a copy of its code bundle (`worker.workdir`)."""
PROGRAM_EVENTS = frozenset({"metric", "eval", "log"})
"""What a program's protocol line may be; any other is printed text."""


def prepare_folders(
    job_folder: Path, identity: sandbox.Identity | None, folders: tuple[str, ...] = (CHECKPOINTS, OUTPUT)
) -> None:
    """The job folder and its `folders` (checkpoints, output; a command job's working folder),
    the program's own. A name the program replaced by a link or a file in an earlier attempt
    is refused, not followed."""
    job_folder.mkdir(parents=True, exist_ok=True)
    sandbox.hand_over(job_folder, identity)
    for name in folders:
        path = job_folder / name
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise sandbox.SandboxError(f"{name} in the job's folder is not a folder: the program replaced it")
        path.mkdir(exist_ok=True)
        sandbox.hand_over(path, identity)


def program_pythonpath(launch: Launch, *folders: Path) -> str:
    """A program's `PYTHONPATH`: towerq's folders first (each line of its Python processes
    written whole by `program_site`, `import towerq`), then `folders` (a notebook's code
    bundle), then the job's own."""
    own = (launch.spec.get("env") or {}).get("PYTHONPATH")
    return os.pathsep.join([str(PROGRAM_SITE), str(REPO_ROOT), *map(str, folders), *filter(None, [own])])


def program_environment(
    launch: Launch, settings: Settings, seen_folder: Path, sandboxed: bool, python_env: Path | None = None
) -> dict[str, str]:
    """The trainer's environment (the allow-list, its GPUs) plus the job's own `env` and what
    towerq gives a program. The lab's Python comes first on PATH: `python` is the one
    towerq runs its trainer with, or the job's own environment's over it (`python_env`,
    `worker.pyenv`); towerq's folders come first on `PYTHONPATH`, then the job's own."""
    env = trainer_environment(launch.indices, settings.trainer_env_pass)
    own = launch.spec.get("env") or {}
    env.update(own)
    first = [str(Path(sys.executable).parent)]
    if python_env is not None:
        first.insert(0, str(python_env / "bin"))
        env["VIRTUAL_ENV"] = str(python_env)
    env["PATH"] = os.pathsep.join([*first, env.get("PATH") or os.defpath])
    # each line of its Python processes written whole (`program_site`), `import towerq`, then its own
    env["PYTHONPATH"] = program_pythonpath(launch)
    env["TOWERQ_JOB_ID"] = str(launch.job_id)
    env["TOWERQ_ATTEMPT"] = str(launch.attempt)
    env["TOWERQ_CHECKPOINT_DIR"] = str(seen_folder / CHECKPOINTS)
    env["TOWERQ_OUTPUT_DIR"] = str(seen_folder / OUTPUT)
    env["TOWERQ_GPU_COUNT"] = str(len(launch.indices))
    env["TOWERQ_BATCH_GPUS"] = str(launch.spec.get("gpu_count") or len(launch.indices))
    if launch.spec.get("signal"):  # the warning it asked for: `worker.gang` hands it to each rank
        env[gang.SIGNAL_ENV] = launch.spec["signal"]
    if launch.rank == 0:  # towerq.report(): the other ranks' points are not the job's
        env["TOWERQ_METRICS_LOG"] = str(seen_folder / program_metrics_log(launch.attempt))
    if launch.inputs:
        env["TOWERQ_INPUTS"] = json.dumps(input_paths(launch, sandboxed))
    dataset = str(launch.spec.get("dataset") or "").partition(":")[2]
    if dataset:
        env["TOWERQ_DATA_DIR"] = str(settings.data_dir.resolve() / dataset)
    env.update(memory_hints(launch))
    if launch.ranks > 1:
        env.update(rank_environment(launch))
    return env


def per_host(launch: Launch) -> int:
    """How many processes the program runs as on each host."""
    return len(launch.indices) if launch.spec.get("processes") == "per_gpu" else 1


def ports_per_rank(launch: Launch) -> int:
    """The run of ports each host's rank takes at the rendezvous: the meeting point (rank
    0's; the same on the others, unused) and one for each process's own listener
    (TensorFlow's server), `gang.over_hosts`."""
    return per_host(launch) + 1


def rank_environment(launch: Launch) -> dict[str, str]:
    """A command job over several hosts (`network: true`: its ranks meet at the addresses of
    the rendezvous, on the hosts' network). One process here: its rank's environment. One per
    GPU: the gang of `worker.gang` numbers them over the job. Only the job's rank 0 keeps
    `TOWERQ_METRICS_LOG`."""
    if launch.spec.get("processes") == "per_gpu":
        return {gang.GANG_ENV: json.dumps({"hosts": launch.cluster, "rank": launch.rank})}
    master, workers, first = gang.over_hosts(launch.cluster, launch.rank, 1)
    return gang.distributed_environment(master, workers, first, 0, 1)


def memory_hints(launch: Launch) -> dict[str, str]:
    """What keeps a well-behaved framework inside its share of each GPU: grow on demand
    rather than take the whole card, and (JAX) take at most the fraction."""
    hints = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    hints["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if launch.fraction < 1:
        hints["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{launch.fraction:.3f}"
    return hints


def program_command(
    launch: Launch, settings: Settings, job_folder: Path, sandboxed: bool, python_env: Path | None = None
) -> list[str]:
    """The job's `command`, inside bubblewrap when `sandboxed`, working in a copy of its
    code bundle it may write in (`worker.workdir`: `python train.py` finds it there); its
    Python environment (`python_env`) shown read only."""
    command = [str(arg) for arg in launch.spec["command"]]
    if launch.spec.get("processes") == "per_gpu":
        command = [sys.executable, "-m", "worker.gang", "--", *command]
    bundle = code_seen(launch, settings, sandboxed)
    assert bundle is not None, "a command job has a code bundle"
    seen = sandbox.JOB_PATH if sandboxed else job_folder
    command = [sys.executable, "-m", "worker.workdir", str(bundle), str(seen / WORK), "--", *command]
    if not sandboxed:
        return command
    network = bool(launch.spec.get("network"))
    shown = [python_env] if python_env is not None else []
    return in_sandbox(
        command, launch, settings, job_folder, network,
        workdir=sandbox.JOB_PATH, read_only=shown, environment_on_stdin=True,
    )  # fmt: skip


def over_share(gpus: list[GpuState], launch: Launch, pids: set[int], reserved_mb: int) -> str | None:
    """What a program holds past its share of one of its GPUs, in words naming both numbers,
    or None. Its share of a GPU is fraction × (memory − what the driver keeps): the slices of
    jobs whose fractions add up to 1 fit on the card together, CUDA contexts included (NVML
    counts a process's context in its memory)."""
    for gpu in gpus:
        if gpu.index not in launch.indices:
            continue
        used = sum(p["used_mb"] or 0 for p in gpu.processes if p["pid"] in pids)
        share = int(launch.fraction * (gpu.memory_total_mb - reserved_mb))
        if used > share:
            return (
                f"its processes held {used:,} MiB of GPU {gpu.index}, over its share of {share:,} MiB "
                f"(gpu_memory_fraction {launch.fraction:g} of {gpu.memory_total_mb:,} MiB, less {reserved_mb} MiB "
                "the driver keeps)"
            )
    return None


class ProgramRunner(AttemptRunner):
    """An attempt of a command job: the member's program, run as the trainer is run."""

    program = True

    _over_share_since: float | None = None
    """Since when its processes have held more GPU memory than its share (`_watch`)."""
    _replaced = False
    """A resumed attempt's first point came (`_event`)."""
    _warned_for: int | None = None
    """The time limit the program was warned of (`_warn`)."""
    python_env: Path | None = None
    """Its requirements' environment (`worker.pyenv`), where it names some."""

    def input_named(self, job_id: int) -> str:
        return f"$TOWERQ_INPUTS (JSON) ['{job_id}']"

    def _prepare(self) -> Starter:
        settings, launch = self.settings, self.launch
        prepare_folders(self.artifacts, trainer_user(settings) if self.sandboxed else None, (CHECKPOINTS, OUTPUT, WORK))
        seen = sandbox.JOB_PATH if self.sandboxed else self.artifacts
        folder = self._python_env()
        env = program_environment(launch, settings, seen, self.sandboxed, folder)
        command = program_command(launch, settings, self.artifacts, self.sandboxed, folder)
        cwd = self.artifacts  # `worker.workdir` starts the program in its working folder
        how = f"the command {shlex.join(launch.spec['command'])[:500]}"

        def start(group: AttemptGroup) -> tuple[subprocess.Popen[bytes], dict[str, str], str]:
            return self._start_program(command, cwd, env, group), env, how

        return start

    def _python_env(self) -> Path | None:
        """Its requirements' environment (`worker.pyenv`), where it names some."""
        requirements = self.launch.spec.get("requirements")
        settings = self.settings
        self.python_env = (
            pyenv.env_folder(settings.var_dir, requirements, settings.pip_options) if requirements else None
        )
        return self.python_env

    def _start_program(
        self, command: list[str], cwd: Path, env: dict[str, str], group: AttemptGroup
    ) -> subprocess.Popen[bytes]:
        """Its process: with requirements, their environment is built (or found) first,
        outside the sandbox, by that process (`worker.pyenv`). Outside the sandbox nothing
        else ends it when its worker died; inside, bwrap does, once it runs."""
        requirements = list(self.launch.spec.get("requirements") or [])
        program_env = env if self.sandboxed else None  # it comes on stdin, past bwrap and setpriv
        launcher, starts_with = pyenv.launcher({} if self.sandboxed else env, requirements, self.settings)
        death = None if self.sandboxed and not launcher else dies_with_this_process()
        return start_trainer(command, cwd, starts_with, group, death, launcher, program_env)

    def _ports(self) -> int:
        return ports_per_rank(self.launch)

    def _check(self, elapsed: float) -> None:
        super()._check(elapsed)
        self._warn(elapsed)

    def _warn(self, elapsed: float) -> None:
        """The job's `signal` (`USR1@600`) to the program, once, that long before the time
        limit stops it; once more if the limit changes after (`towerq update`). Not while
        it is being stopped, nor before its process started (tried again a second later)."""
        said, limit = self.launch.spec.get("signal"), self.launch.time_limit_s
        if said is None or limit is None or self._warned_for == limit or self.process is None:
            return
        name, before = limit_signal(said)
        if elapsed < limit - before or self._stop_requested.is_set() or self.process.poll() is not None:
            return
        if signal_program(self.process.pid, getattr(signal, f"SIG{name}"), self.sandboxed):
            self._warned_for = limit
            left = max(0, round(limit - elapsed))
            self.sink.log("info", f"SIG{name} sent: the time limit of {limit_text(limit)} stops it in {left} s")

    def _takes(self, event: events.TrainerEvent | events.Refused) -> bool:
        """Only what a program may say (a `started`, `done`, ... line is the trainer's word:
        text from a program), and only rank 0's: it speaks for the job."""
        return event.event in PROGRAM_EVENTS and self.chief

    def _event(self, event: events.TrainerEvent | events.Refused) -> None:
        """A resumed attempt's first point says where it resumed: the points from there on
        go (`MetricSink.replace_from`)."""
        if isinstance(event, (events.Metric, events.Eval)) and self.launch.attempt > 1 and not self._replaced:
            self._replaced = True
            self.sink.replace_from(event.step)
        super()._event(event)

    def _watch(self) -> None:
        """A program sharing its GPUs has no framework limit towerq sets: NVML's count of
        its processes' memory must stay inside its share, or it is stopped after the grace."""
        if self.launch.fraction >= 1 or self.inventory.simulated:
            return
        settings = self.settings
        self._note_pids()
        over = over_share(self.inventory.refresh(), self.launch, self.trainer_pids, settings.gpu_memory_reserved_mb)
        now = time.monotonic()
        if over is None:
            self._over_share_since = None
        elif self._over_share_since is None:
            self._over_share_since = now
            self.sink.log("warning", f"{over}: stopped if it still does in {settings.gpu_memory_grace_s:g} s")
        elif now - self._over_share_since >= settings.gpu_memory_grace_s:
            self.request_stop(Stop.GPU_MEMORY, over)
