"""Starting one attempt of one job: what to run, the trainer's spec file, its process.

The trainer runs as `python -m worker.trainer SPEC.json` in its own session (so its whole
process group can be signalled), with `CUDA_VISIBLE_DEVICES` set to exactly the allocated
GPUs; it asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG, in the
trainer). The spec file is built by the spec contract (`towerq.contract.runtime.trainer_input`)
from the job's stored spec, never by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from service.core.attempts import job_inputs
from service.core.context import Context
from service.core.exceptions import StaleAttemptError
from service.core.models import Job, JobState
from service.core.settings import Settings
from towerq.contract.paths import bundle_root, job_folder, replace_beneath
from towerq.contract.runtime import RuntimeSpec, trainer_input
from towerq.contract.versions import SPEC_VERSION
from worker import disk_kind, sandbox, sandbox_env
from worker.cgroups import DEFAULT_SHARES, AttemptGroup, Limits
from worker.sandbox_status import TrainerProcess, with_status
from worker.trainer import tunnel

REPO_ROOT = Path(__file__).resolve().parents[1]


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
    inputs: list[tuple[int, Path]] = field(default_factory=list)
    """The folders of the jobs it waited for (`after`) that its owner may read: (job id, folder)."""
    notes: list[str] = field(default_factory=list)
    """What the attempt's log should say of its launch (a dependency's folder left out, and why)."""
    rank: int = 0
    hosts: list[str] = field(default_factory=list)
    """A job over several hosts: every host it runs on, by rank (this one is `rank`)."""
    cluster: list[str] = field(default_factory=list)
    """Every rank's address:port, once they met (`worker.rendezvous`)."""
    user_id: int = 0
    """The member whose job it is (a notebook session mounts their folder, `worker.notebook`)."""
    spec_version: int = SPEC_VERSION
    """The version of the spec's rules that admitted it (`towerq.contract.versions`)."""
    gate: Path | None = None
    """A sandboxed rank: the folder of its worker's control socket (`worker.trainer.tunnel`),
    seen at `sandbox.RANKS_PATH` in the sandbox, which then has no network of its host."""

    @property
    def ranks(self) -> int:
        return max(1, len(self.hosts))

    @property
    def where(self) -> str:
        """`rank r on host`, for a job over several hosts; "" for a one-host job."""
        return f"rank {self.rank} on {self.host}" if self.ranks > 1 else ""


def read_launch(ctx: Context, job_id: int, attempt: int, host: str) -> Launch:
    """The launch of `attempt` of `job_id` on `host`, if it is still the current one."""
    with ctx.db.read() as session:
        job = session.get(Job, job_id)
        if job is None or job.attempts != attempt or job.state != JobState.DISPATCHED:
            raise StaleAttemptError(f"job {job_id} attempt {attempt} is not waiting to start")
        held = [a for a in job.allocations if a.attempt == attempt and a.released_at is None]
        hosts = list(dict.fromkeys(a.host.name for a in held))  # by rank: the order the pass gave them
        if host not in hosts and job.host_name != host:
            raise StaleAttemptError(f"job {job_id} attempt {attempt} is for host {job.host_name}, not {host}")
        rows = [(a.gpu.index, a.gpu.memory_total_mb, a.gpu.simulated, a.fraction) for a in held if a.host.name == host]
        inputs, notes = job_inputs(session, job, ctx.settings.artifacts_dir)
    rows.sort()
    return Launch(
        job_id=job_id,
        attempt=attempt,
        host=host,
        indices=[r[0] for r in rows],
        fraction=rows[0][3] if rows else 1.0,
        spec=job.spec,
        spec_version=job.spec_version,
        time_limit_s=job.time_limit_s,
        memory_total_mb=[r[1] for r in rows],
        simulated=all(r[2] for r in rows),
        inputs=inputs,
        notes=notes,
        rank=hosts.index(host) if host in hosts else 0,
        hosts=hosts if len(hosts) > 1 else [],
        user_id=job.user_id,
    )


INPUTS_PATH = Path("/inputs")
"""Where a sandboxed trainer sees the folders of the jobs it waited for: `/inputs/job-<id>`."""


def input_in_sandbox(job_id: int) -> Path:
    """Where a sandboxed trainer sees the folder of job `job_id`, one it waited for."""
    return INPUTS_PATH / f"job-{job_id}"


def input_paths(launch: Launch, sandboxed: bool) -> dict[str, str]:
    """Each input folder as the trainer sees it, by job id."""
    return {
        str(job_id): str(input_in_sandbox(job_id) if sandboxed else folder.resolve())
        for job_id, folder in launch.inputs
    }


def artifacts_dir(settings: Settings, job_id: int) -> Path:
    return job_folder(settings.artifacts_dir, job_id)


def write_trainer_spec(launch: Launch, settings: Settings, artifacts: Path, sandboxed: bool = False) -> Path:
    """The trainer's spec file of this attempt. Raises pydantic's ValidationError when the
    job's stored spec no longer passes the contract. In the sandbox the trainer's parent is
    bwrap, which dies with the worker (so the trainer does not watch the worker's pid), and
    the trainer sees its folder at `sandbox.JOB_PATH`."""
    runtime = RuntimeSpec(
        job_id=launch.job_id,
        attempt=launch.attempt,
        artifacts_dir=str(sandbox.JOB_PATH if sandboxed else artifacts),
        data_dir=str(settings.data_dir.resolve()),
        models_path=str(settings.models_path.resolve()),
        code_path=str(code) if (code := code_seen(launch, settings, sandboxed)) else None,
        simulated=launch.simulated,
        num_devices=len(launch.indices),
        gpu_memory_fraction=launch.fraction,
        gpu_memory_total_mb=launch.memory_total_mb,
        gpu_memory_reserved_mb=settings.gpu_memory_reserved_mb,
        gpu_process_overhead_mb=settings.gpu_process_overhead_mb,
        parent_pid=None if sandboxed else os.getpid(),
        nice=settings.trainer_nice,
        inputs=input_paths(launch, sandboxed),
        cluster=launch.cluster,
        rank=launch.rank,
        collective_timeout_s=settings.collective_timeout_s,
        rank_tunnel=f"{sandbox.RANKS_PATH}/{tunnel.CONTROL}" if sandboxed and launch.gate is not None else None,
    )
    spec = trainer_input(launch.spec, runtime, launch.spec_version)
    artifacts.mkdir(parents=True, exist_ok=True)
    name = f"spec-attempt-{launch.attempt}" + (f"-rank-{launch.rank}" if launch.rank else "") + ".json"
    replace_beneath(artifacts, name, spec.model_dump_json(indent=2))  # never through a planted link
    return artifacts / name


TRAINER_ENV_ALLOWED = (
    # the basics of a process
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES",
    "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "VIRTUAL_ENV",
    # GPUs and the CUDA runtime
    "CUDA_HOME", "CUDA_PATH", "CUDA_CACHE_PATH", "CUDA_CACHE_MAXSIZE", "CUDA_CACHE_DISABLE",
    "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
    "LD_LIBRARY_PATH",
    # TensorFlow and XLA
    "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR",
    "TF_ENABLE_ONEDNN_OPTS", "TF_XLA_FLAGS", "TF_DETERMINISTIC_OPS", "TF_NUM_INTEROP_THREADS",
    "TF_NUM_INTRAOP_THREADS", "XLA_FLAGS",
    # the maths libraries under them
    "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "KMP_BLOCKTIME",
    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
)  # fmt: skip
"""What a trainer inherits of the worker's environment: an allow-list of names (not
prefixes: `TF_*` also let Terraform's `TF_VAR_database_url` through), since the trainer
runs user code and the worker's environment holds the database URL, the Redis password and
whatever else its host put there. `TOWERQ_TRAINER_ENV_PASS` adds names."""
NEVER_PASSED = ("TOWERQ_*", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*", "*_KEY", "*_KEY_*")
"""Refused even when an allowed pattern matches them."""


def trainer_environment(indices: list[int], extra_allowed: str = "") -> dict[str, str]:
    """The trainer's environment: the allowed part of this one, seeing only the allocated GPUs."""
    allowed = [*TRAINER_ENV_ALLOWED, *(name.strip() for name in extra_allowed.split(",") if name.strip())]
    env = {
        name: value
        for name, value in os.environ.items()
        if any(fnmatchcase(name, pattern) for pattern in allowed)
        and not any(fnmatchcase(name.upper(), pattern) for pattern in NEVER_PASSED)
    }
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in indices)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["PYTHONUNBUFFERED"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = env.get("TF_CPP_MIN_LOG_LEVEL", "1")
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def trainer_user(settings: Settings) -> sandbox.Identity | None:
    """The host user a sandboxed trainer runs as (`TOWERQ_TRAINER_UID`/`_GID` for a root
    worker; None: the worker's own, not root)."""
    return sandbox.trainer_identity(settings.trainer_uid, settings.trainer_gid)


def sandboxed_here(settings: Settings) -> bool:
    """Whether this host's trainers run in the sandbox (`sandbox.resolve`); SandboxError when
    they should and cannot, or when a folder every trainer is shown (`TOWERQ_MODELS_PATH`,
    `TOWERQ_DATA_DIR`) holds towerq's own state: every trainer would read it, or when
    `TOWERQ_JOB_DISK=image` cannot work here (`worker.disk_kind.check`)."""
    sandboxed = sandbox.resolve(settings.sandbox, trainer_user(settings))
    if sandboxed:
        check_shared_folders(settings)
    disk_kind.check(settings.job_disk, settings.var_dir)
    return sandboxed


def check_shared_folders(settings: Settings) -> None:
    """SandboxError when the models path or the data folder is, or holds, one of towerq's
    own folders (its var folder, artifacts, code bundles, database); the data folder's
    `users/` is its own and hidden in every sandbox."""
    uploads = (settings.data_dir / "users").resolve()
    for setting, shared in (("TOWERQ_MODELS_PATH", settings.models_path), ("TOWERQ_DATA_DIR", settings.data_dir)):
        folder = shared.resolve()
        for held in (path.resolve() for path in protected_paths(settings)):
            if held != uploads and (held == folder or folder in held.parents):
                raise sandbox.SandboxError(
                    f"{setting} is {folder}, which holds {held} (towerq's own files): every trainer is shown it "
                    "whole. Point it at a folder of its own"
                )


def trainer_command(launch: Launch, settings: Settings, spec_path: Path, sandboxed: bool) -> list[str]:
    """`python -m worker.trainer SPEC.json`, inside bubblewrap when `sandboxed` (its job
    folder then handed to the trainer's user)."""
    command = [sys.executable, "-m", "worker.trainer", str(seen_path(spec_path, sandboxed))]
    if not sandboxed:
        return command
    sandbox.hand_over(spec_path.parent, trainer_user(settings))
    network = bool(launch.spec.get("network")) or (launch.ranks > 1 and launch.gate is None)
    return in_sandbox(command, launch, settings, spec_path.parent, network)


def in_sandbox(
    command: list[str],
    launch: Launch,
    settings: Settings,
    job_folder: Path,
    network: bool,
    workdir: Path | None = None,
    binds: Iterable[tuple[Path, Path]] = (),
    read_only: Iterable[Path] = (),
    environment_on_stdin: bool = False,
) -> list[str]:
    """`command` in bubblewrap with this job's view: the trainer's, a command job's (with
    `read_only` folders of its own, seen where they are: its Python environment), a notebook
    session's (which has `binds` of its own, read-write: host folder, seen at). A program
    whose environment is the member's has it come on stdin (`environment_on_stdin`, given to
    `start_trainer` as `program_env`)."""
    datasets, code_path = sandbox_extras(launch, settings)
    return sandbox.bwrap_command(
        [*sandbox_env.ENVIRONMENT_STEP, *command] if environment_on_stdin else command,
        job_folder=job_folder,
        repo_root=REPO_ROOT,
        models_path=settings.models_path,
        data_dir=settings.data_dir,
        datasets=datasets,
        code_path=code_path,
        devices=[] if launch.simulated else sandbox.gpu_nodes(launch.indices),
        identity=trainer_user(settings),
        protected=protected_paths(settings),
        network=network,
        tmp_mb=settings.trainer_tmp_mb,
        inputs=[(folder, input_in_sandbox(job_id)) for job_id, folder in launch.inputs],
        gate=launch.gate,
        workdir=workdir,
        binds=binds,
        read_only=read_only,
        own_folder=sandbox_folder(settings),
    )


def sandbox_folder(settings: Settings) -> Path:
    """Where a host keeps what towerq makes for its sandboxes to see (`TOWERQ_VAR_DIR`'s: never
    shown whole)."""
    return settings.var_dir.resolve() / "sandbox"


def protected_paths(settings: Settings) -> list[Path]:
    """towerq's own state on this host, which no trainer's view may hold whole."""
    paths = [settings.var_dir, settings.artifacts_dir, settings.code_dir, settings.data_dir / "users"]
    database = make_url(settings.database_url).database if settings.database_url.startswith("sqlite") else None
    if database:
        paths.append(Path(database))
    return paths


def seen_path(path: Path, sandboxed: bool) -> Path:
    """A file of the job folder as the trainer sees it."""
    return sandbox.JOB_PATH / path.name if sandboxed else path


def sandbox_extras(launch: Launch, settings: Settings) -> tuple[list[Path], Path | None]:
    """What the job's sandbox shows beyond every job's view: its uploaded dataset folders
    and its code bundle's files (seen at `sandbox.CODE_PATH`)."""
    options = launch.spec.get("dataset_options") or {}
    asked = [str(launch.spec.get("dataset", "")).partition(":")[2], options.get("test_path") or ""]
    return sandbox.dataset_folders(settings.data_dir, [path for path in asked if path]), code_seen(launch, settings)


def code_seen(launch: Launch, settings: Settings, sandboxed: bool = False) -> Path | None:
    """Where the job's code bundle is, as its process sees it: `sandbox.CODE_PATH` in the
    sandbox (for every job the same, so a warm trainer can take any bundle, `worker.pool`),
    else its folder under `TOWERQ_CODE_DIR`. None for a job without one."""
    code = launch.spec.get("code")
    if not code:
        return None
    return sandbox.CODE_PATH if sandboxed else bundle_root(settings.code_dir, code)


def start_trainer(
    command: list[str],
    cwd: Path,
    env: dict[str, str],
    group: AttemptGroup | None = None,
    before_exec: Callable[[], None] | None = None,
    launcher: list[str] | None = None,
    program_env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """The process of one attempt (the trainer, or a command job's program), in a session of
    its own (and in the attempt's cgroups, before it runs anything), its output piped,
    working in `cwd` (the trainer: the job's artifacts folder, where a model's own relative
    files land). `before_exec` runs in the child too, after joining the cgroups. In the
    sandbox bwrap says whether it started the command (`worker.sandbox_status`). `launcher`
    runs first and execs the command (`worker.pyenv`, a job's requirements). `program_env`:
    the environment of a sandboxed program (`in_sandbox(..., environment_on_stdin=True)`),
    which comes on its stdin; the process starts with `env` (none of the member's). Given for
    a command without that step, it is refused (the program would start with none of it); the
    step without it runs nothing and says so (`sandbox_env.ENVIRONMENT_END`)."""
    joins = group.join if group is not None and group.exists else None

    def prepare() -> None:
        if joins is not None:
            joins()
        if before_exec is not None:
            before_exec()

    if program_env is not None and not sandbox_env.reads_environment(command):  # it would start with none
        raise ValueError("a program's environment given for a command that does not read it on stdin")
    environment = sandbox_env.environment_file(program_env) if program_env is not None else None  # may refuse a name
    command, status, status_w = with_status(command)
    command = [*(launcher or []), *command]
    try:
        process = TrainerProcess(
            command,
            stdin=subprocess.DEVNULL if environment is None else environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=prepare if joins is not None or before_exec is not None else None,
            pass_fds=() if status_w is None else (status_w,),
        )
    except BaseException:
        if status is not None:
            os.close(status)
        raise
    finally:
        if status_w is not None:
            os.close(status_w)
        if environment is not None:
            os.close(environment)
    process.status_fd = status
    return process


def attempt_limits(launch: Launch, settings: Settings, host_gpus: int) -> Limits:
    """The memory and process limits of one attempt (TOWERQ_TRAINER_MEMORY_MB, ..._MAX_PROCESSES),
    and its CPU weight: for each GPU it holds (in proportion for a fraction), what one trainer
    process at `TOWERQ_TRAINER_NICE` weighs. So attempts share contended cores by their GPUs,
    and all of them together yield to towerq's own processes as niced trainers always did."""
    memory = settings.trainer_memory_mb
    if memory == 0:
        share = len(launch.indices) * launch.fraction / max(host_gpus, len(launch.indices), 1)
        memory = max(
            MIN_TRAINER_MEMORY_MB, int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * share / 2**20)
        )
    gpus = len(launch.indices) * launch.fraction
    shares = max(2, round(DEFAULT_SHARES * NICE_STEP**-settings.trainer_nice * gpus))
    return Limits(memory_mb=memory, processes=settings.trainer_max_processes or None, cpu_shares=shares)


NICE_STEP = 1.25
"""How much less CPU weight each step of niceness gives (the kernel's table: nice 10
weighs 110 where nice 0 weighs 1024)."""
MIN_TRAINER_MEMORY_MB = 2048
"""The least memory an attempt gets by default: a Python process with TensorFlow and a small
model needs about 1 GB before its data."""
