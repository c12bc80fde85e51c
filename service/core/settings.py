"""The one settings object every towerq process reads (`TOWERQ_` environment prefix)."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.core.defaults import (
    DEFAULT_AGING_S,
    DEFAULT_HALF_LIFE_S,
    DEFAULT_MAX_RESERVATIONS,
    DEFAULT_RESERVE_AFTER_S,
)
from towerq.contract.api import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_URL


class Settings(BaseSettings):
    """Settings shared by `towerq up`, `api`, `worker`, `scheduler` and `db upgrade`.

    Every field is read from `TOWERQ_<NAME>` (e.g. `TOWERQ_DATABASE_URL`), so a test can
    point a whole stack at its own database, Redis db and folders.
    """

    model_config = SettingsConfigDict(env_prefix="TOWERQ_", extra="ignore")

    var_dir: Path = Path("./var")
    """Local state of `towerq up`: the admin token file, the embedded Redis' folder."""
    database_url: str = "sqlite:///./var/towerq.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    data_dir: Path = Path("./var/data")
    artifacts_dir: Path = Path("./var/artifacts")
    models_path: Path = Path("./var/models")
    code_dir: Path = Path("./var/code")
    """Uploaded code bundles, content-addressed; on storage every worker sees (like artifacts)."""
    envs_max: int = Field(default=20, ge=1)
    """Command jobs' Python environments (`requirements`, `worker.pyenv`) a host keeps in
    `TOWERQ_VAR_DIR/envs`: past it, the least recently used that no job holds go."""
    envs_prepare: bool = True
    """A host builds the environments of queued jobs' `requirements` while they wait
    (`worker.prepare`), so pip's time is not spent holding their GPUs once they start."""
    pip_options: str = ""
    """What pip is told besides the job's requirements, where pip's own config does not say
    it: `--index-url https://pypi.lab/simple`, or `--no-index --find-links /srv/wheels`."""
    max_code_bytes: int = Field(default=20_000_000, ge=1)
    """The largest code bundle upload (packed)."""
    max_code_files: int = Field(default=2_000, ge=1)
    max_code_unpacked_bytes: int = Field(default=200_000_000, ge=1)
    user_code_quota_bytes: int = Field(default=2_000_000_000, ge=0)
    """What the code bundles one user uploaded may take in all (unpacked)."""
    job_folder_max_bytes: int = Field(default=50_000_000_000, ge=0)
    job_log_max_mb: int = Field(default=256, ge=1)
    job_metric_points_max: int = Field(default=2_000_000, ge=1)
    """Metric points a job may store, every attempt together (each attempt at most
    METRIC_POINTS_PER_ATTEMPT): past it more are dropped and the job's log says so once. A
    trainer that crashes on purpose would otherwise store that many per attempt."""
    """The log one job may write, all its attempts together (each line counted once though
    it is kept twice, in the database and in `log.txt`); past it its lines are dropped and
    its log says so once. Shown per member on the Usage page."""
    """What one job's folder (checkpoints, exports, its own files) may hold; a job past it
    is stopped and fails, naming this limit (0: no limit)."""
    job_disk: str = Field(default="auto", pattern=r"^(auto|image|measure)$")
    """How a job folder's limit holds: `auto` (the default: an image where the worker can make
    one, a root worker with loop devices and artifacts not on network storage, else the
    measure), `image` (while an attempt runs the folder is a filesystem of exactly that size
    of its own: writes past it fail; needs a root worker), `measure` (a walk of it while the
    job runs: it is stopped past the limit, about a second of its writing late).
    worker/disk.py says how."""
    job_folder_check_s: float = Field(default=30.0, gt=0)
    """How often a worker measures a running job's folder (a walk of it: I/O on the worker)."""
    user_data_quota_bytes: int = Field(default=20_000_000_000, ge=0)
    """What one user's dataset uploads may take in all (`TOWERQ_DATA_DIR/users/<user>/`)."""
    max_dataset_files: int = Field(default=1_000_000, ge=1)
    """The most files an uploaded image folder may hold."""

    # None: NVML GPUs when a driver answers, else 4 simulated ones; a number forces simulation.
    simulated_gpus: int | None = Field(default=None, ge=0, le=64)
    host_name: str = Field(default_factory=socket.gethostname)
    require_gpus: bool = False
    """A GPU host: no NVIDIA driver answering is an error, not a fallback to simulated GPUs."""

    gpu_memory_reserved_mb: int = Field(default=480, ge=0)
    """Memory a GPU has in use with no process on it (an idle H100 80GB, driver 580: 480 MB).
    A shared GPU's slices are fractions of what is left."""
    gpu_process_overhead_mb: int = Field(default=526, ge=0)
    """What each process pays on a GPU outside any framework limit (its CUDA context and
    allocator): 526 MB measured on an H100 (a process holding a 2,048 MB tensor used
    2,574 MB). `scripts/check-gpus.py --probe` measures it on a host."""
    gpu_memory_grace_s: float = Field(default=10.0, ge=0)
    """How long a command job sharing a GPU (gpu_memory_fraction < 1) may hold more than its
    share of the GPU's memory (NVML's count of its processes) before it is stopped."""
    gpu_use_sample_s: float = Field(default=10.0, gt=0)
    """How often an attempt's runner reads how busy its GPUs are and what its processes hold
    there (`worker.gpu_use`): a job's GPU use is the mean and peak of these samples. Each is
    a few NVML calls per GPU; 10 s gives a job of a few minutes a figure."""
    gpu_idle_warn_s: float = Field(default=1800.0, ge=0)
    """A job whose GPUs stay idle (busy under 5% at every sample) this long is told so in its
    log and its webhooks (`job.idle`), once for each idle stretch (0: never); a notebook
    session ends when idle instead."""
    gpu_idle_stop_s: float = Field(default=0.0, ge=0)
    """A job whose GPUs stay idle this long is stopped: it fails, saying so (its checkpoint
    kept); 0 (the default): never. Not a notebook session (its own idle end). A job over
    several hosts is stopped once every rank's GPUs have been idle this long (each host's
    worker sees only its own: `service.core.attempts.attempt_status`)."""

    trainer_nice: int = Field(default=10, ge=0, le=19)
    """CPU niceness of trainers: where they share a host's cores with towerq itself (the
    worker's relay and heartbeat, or a whole `towerq up`), the service stays responsive
    while they saturate the CPU; idle cores still go to them. An attempt's cgroup weighs
    what one process at this niceness weighs for each of its GPUs (worker/cgroups.py)."""

    trainer_memory_mb: int = Field(default=0, ge=0)
    """Host memory one trainer attempt may use (its cgroup's, all its processes together);
    0: its share of the host's memory by the GPUs it holds (GPUs x fraction / the host's
    GPUs), at least 2,048 MB. Past it the kernel kills the attempt and the job fails, naming
    the limit (worker/cgroups.py)."""
    trainer_max_processes: int = Field(default=4096, ge=0)
    """Processes and threads one trainer attempt may have at once (TensorFlow starts a few
    dozen threads per device); 0: no limit. Past it a fork fails inside the job."""

    trainer_pool: int = Field(default=1, ge=0, le=16)
    """Warm trainers a worker keeps: processes that have loaded TensorFlow and wait for a
    job, so a job trains without waiting for that (worker/pool.py; 0 turns them off). Each
    costs the memory of a Python process with TensorFlow loaded, and never serves twice."""

    executor: str = Field(default="local", pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    """What runs the jobs, by its name in the registry of `service/executors/`: `local`, the
    lab's own hosts, each with a `towerq worker`, placed by towerq's scheduler; `slurm`, an
    existing Slurm cluster, which decides where and when (docs/deployment.md, "On a Slurm
    cluster"). A name no executor has is refused when a process starts, naming those known."""
    slurm_partition: str = Field(default="", pattern=r"^[A-Za-z0-9_.,-]*$")
    """The partition(s) towerq's Slurm jobs go to (`sbatch --partition`); empty: the cluster's default."""
    slurm_account: str = Field(default="", pattern=r"^[A-Za-z0-9_.-]*$")
    """The Slurm account they are charged to (`sbatch --account`); empty: the submitting user's default."""
    slurm_job_prefix: str = Field(default="towerq", pattern=r"^[A-Za-z0-9_]{1,32}$")
    """Slurm job names are `<prefix>-<job>-<attempt>`: how towerq finds its own jobs in
    `squeue`. Two towerq services submitting as one user need different prefixes."""
    slurm_cpus_per_gpu: int | None = Field(default=None, ge=0, le=1024)
    """CPUs an attempt asks per GPU (`sbatch --cpus-per-task`: GPUs × this); 0: none, Slurm's
    own default; unset: none where the partitions set a `DefCpuPerGPU`, else the nodes'
    share, their CPUs ÷ GPUs (the smallest among them), so a trainer's towers and a command
    job's processes do not share one core (service/executors/slurm_cpus.py)."""
    slurm_python: str = ""
    """The Python that runs an attempt on a compute node (with towerq installed at the same
    path); empty: the one running the scheduler."""
    slurm_max_pending: int = Field(default=200, ge=1)
    """Jobs towerq keeps handed to Slurm and waiting there at once; the rest wait in towerq's
    queue (saying so) and go over as those start. Bounds what one flood of submissions
    puts in the cluster's queue, within a typical `MaxSubmitJobs`."""
    slurm_log_dir: Path = Path("./var/slurm")
    """Where Slurm writes each attempt's own output (`sbatch --output`), out of the jobs'
    reach. What the trainer prints goes to the job's log, as on a local host."""
    sandbox: str = Field(default="auto", pattern=r"^(auto|bwrap|none)$")
    """Where trainers run: `auto` and `bwrap` (in bubblewrap; a worker where it cannot run
    refuses to start), `none` (unsandboxed, an admin's explicit choice, shown on the GPUs
    page). worker/sandbox.py says what a sandboxed trainer can reach."""
    trainer_tmp_mb: int = Field(default=1024, ge=16)
    """The size of a sandboxed trainer's private `/tmp`, and of its `/dev/shm` (each held in
    memory, counted to its memory limit)."""
    trainer_uid: int = Field(default=65534, ge=1, le=2**32 - 2)
    """The host user a sandboxed trainer runs as when the worker is root (`nobody` by
    default; never 0): it runs in a user namespace of its own, so root's files, sysctls and
    devices are not its. A worker that is not root runs its trainers as its own user, in a
    user namespace too."""
    trainer_gid: int = Field(default=65534, ge=1, le=2**32 - 2)
    """The host group of a sandboxed trainer when the worker is root (`nogroup` by default)."""
    trainer_env_pass: str = ""
    """Environment variables (names, or NAME* prefixes; comma-separated) a trainer inherits
    besides the built-in allow-list (worker/launch.py). Names that look like secrets never pass."""

    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    heartbeat_timeout_s: float = Field(default=30.0, gt=0)
    scheduler_interval_s: float = Field(default=5.0, gt=0)
    dispatch_timeout_s: float = Field(default=60.0, gt=0)
    cancel_grace_s: float = Field(default=30.0, ge=0)
    worker_address: str = ""
    """The address other GPU hosts reach this one at, for the ranks of a job over several
    hosts (empty: this host's name as it resolves here)."""
    rank_ports: str = Field(default="29400-29499", pattern=r"^\d{1,5}-\d{1,5}$")
    """The TCP ports a rank of a job over several hosts listens on (one per rank on a host);
    a firewall between GPU hosts must let them through (docs/deployment.md)."""
    collective_timeout_s: float = Field(default=20.0, gt=0, le=3600)
    """How long a rank of a job over several hosts waits for the others at a step before it
    gives the job up as lost (a rank killed is noticed at once, one frozen or stalled after
    this); a step, or an evaluation or checkpoint of rank 0, must take less."""
    rendezvous_timeout_s: float = Field(default=120.0, gt=0)
    """How long the ranks of a job over several hosts wait for each other to be launched."""
    max_attempts: int = Field(default=3, ge=1)
    """Crashed attempts before a job fails, where its spec does not say."""
    max_attempts_limit: int = Field(default=10, ge=1, le=100)
    """The most a member's spec may ask for (`max_attempts`): each attempt may write its log,
    metrics and disk anew, and a trainer may crash on purpose (exit 143 counts as a crash).
    Admins' jobs may ask up to 100."""

    user_gpu_limit: int | None = Field(default=None, ge=1)
    """GPUs one user may hold at once; none by default: fair share, time slicing (which never
    lets a user above their share stop another's job) and this lab's idle GPUs going to
    whoever waits already bound a heavy user, and a cap would leave GPUs idle on a quiet day."""
    user_max_queued_jobs: int = Field(default=2000, ge=0)
    """Jobs one user may have waiting at once (a sweep counts all its jobs); 0: no limit.
    Room for a sweep of 1,000 and a day's other work; a flood past it gets 429."""
    fair_share_half_life_s: float = Field(default=DEFAULT_HALF_LIFE_S, gt=0)
    aging_s: float = Field(default=DEFAULT_AGING_S, gt=0)
    reserve_after_s: float = Field(default=DEFAULT_RESERVE_AFTER_S, ge=0)
    max_reservations: int = Field(default=DEFAULT_MAX_RESERVATIONS, ge=0)
    preemption: bool = False
    time_slice_gpu_s: float = Field(default=3600.0, ge=0)
    """Time slicing (0 turns it off): a job that has used this many GPU-seconds, all its
    attempts together, ranks a class lower, and fresh work of its priority or higher may
    stop it (it checkpoints and queues again) once this attempt has run 10 minutes and as
    long as its earlier attempts together. Short work never waits days behind long work;
    a long job is stopped at most about log2(its run time / its first slice) times. One
    GPU-hour is the policy's reference length; 81% of the Philly trace sample's jobs use
    less, so most work is never stopped."""

    api_host: str = DEFAULT_HOST
    api_port: int = DEFAULT_PORT
    api_workers: int = Field(default=2, ge=1, le=64)
    """API processes: Python serves one request at a time per process."""
    webhook_url: str | None = Field(default=None, pattern=r"^https?://")
    """Where to POST a JSON notification whenever a job ends (Slack-compatible `text`)."""
    webhook_secret: str | None = None
    webhook_allow: str = ""
    """Hosts and networks (comma-separated: `chat.lab.internal, 10.0.5.0/24`) that members'
    `notify_url`s may reach although they are not public addresses; by default those reach
    the internet only (service/notifications/outbound.py). The lab's own TOWERQ_WEBHOOK_URL is not filtered."""
    webhook_retry_s: float = Field(default=2.0, gt=0)
    """The first retry of a failed webhook waits this long; later ones 5, 15, 60 ... times it."""
    """Signs each notification: `X-Towerq-Signature: sha256=<HMAC-SHA256 of the body>`."""
    api_parent_pid: int | None = None
    """Set by `towerq api` for its worker processes, which die with it (not a user setting)."""
    api_url: str = DEFAULT_URL
    """The API's own address, in links it sends (webhooks, `towerq admin bootstrap`) when
    `public_url` is not set. The client commands read TOWERQ_API_URL themselves
    (`towerq.config`)."""
    public_url: str | None = None
    """The dashboard's address as users reach it (behind a proxy, e.g. https://lab.example/towerq):
    the login link `towerq admin bootstrap` prints. Default: the API's own address."""
    root_path: str = Field(default="", pattern=r"^(/[^/\s]+)*$")
    """The path prefix a reverse proxy serves towerq under (e.g. /towerq), the proxy stripping it."""
    forwarded_allow_ips: str = "127.0.0.1"
    """Proxies whose X-Forwarded-For/-Proto headers are trusted (comma-separated, or *)."""
    max_streams_per_token: int = Field(default=50, ge=1)
    """Live streams (open job pages, `towerq logs -f`, lists) one token may hold at once,
    across every API process; they share one Redis subscription per process."""
    max_streams_per_member: int = Field(default=100, ge=1)
    """Live streams one member may hold at once, all their tokens together (a member mints
    tokens at will: a cap per token alone is no cap)."""
    stream_max_life_s: float = Field(default=3600.0, gt=0)
    """A live stream ends after this long and its client reconnects, its token checked afresh
    (EventSource and `towerq logs -f` do so on their own). Shorter behind a proxy that cuts
    long responses. The API's fuzz test sets one second: a client that reads a stream to its
    end (its keepalives reset any read timeout) would otherwise wait an hour."""
    max_tokens_per_member: int = Field(default=20, ge=1)
    """Live (not revoked) API tokens one member may hold; past it a new one is refused (429)
    until they revoke one (`towerq tokens revoke ID`)."""
    token: str | None = None
    max_request_bytes: int = 1_000_000

    # Notebook sessions (docs/notebooks.md)
    notebook_idle_timeout_s: int = Field(default=3600, ge=10)
    """A session's idle timeout when it names none."""
    notebook_max_idle_timeout_s: int = Field(default=4 * 3600, ge=10)
    """The longest idle timeout a member's session may ask (an admin's may ask more)."""
    notebook_max_time_limit_s: int = Field(default=24 * 3600, ge=0)
    """A session's time limit when it names none, and the longest a member's may ask (an
    admin's may ask more; 0: none). What ends a session whose kernel is kept busy, and what
    a job waiting behind one is told to expect."""
    notebook_max_per_member: int = Field(default=2, ge=0)
    """Sessions one member may have queued or running at once (0: none)."""
    notebook_max_gpus: int = Field(default=0, ge=0)
    """GPUs the lab's sessions may hold together, queued and running (0: no cap)."""
    notebook_home_max_bytes: int = Field(default=10_000_000_000, ge=0)
    """What one member's notebook folder (every session of theirs mounts it) may hold; a
    session past it is stopped, its files kept (0: no limit)."""
    notebook_start_timeout_s: float = Field(default=120.0, gt=0)
    """How long JupyterLab may take to open its socket before the session fails."""

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def rank_port_range(self) -> tuple[int, int]:
        """`rank_ports` as (lowest, highest)."""
        low, _, high = self.rank_ports.partition("-")
        return int(low), int(high)


def redacted(url: str) -> str:
    """`url` with its password replaced by `***`, for logs and banners."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
