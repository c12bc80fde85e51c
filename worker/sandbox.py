"""The trainer's sandbox: what user code can reach on a GPU host.

A trainer runs a user's code, so with bubblewrap (`bwrap`, Debian's `bubblewrap`) it runs
in namespaces of its own that show only what the job needs:

- read-only: the system (`/usr`, `/etc`, ...), the Python installation the worker runs on
  (its prefixes and its import path), towerq's `worker` package and the job-spec contract
  (`towerq.contract`),
  `TOWERQ_MODELS_PATH`, the job's own code bundle (at `/code`, `CODE_PATH`, the same path
  for every job, so a warm trainer can take a job with a bundle), and `TOWERQ_DATA_DIR` with every user's
  uploads (`users/`) hidden but the dataset folders the job asked for. Nothing that holds
  towerq's own state is ever bound whole (the folder `towerq up` ran in, with its `var/`):
  the folder the worker started in, and any path entry above `TOWERQ_VAR_DIR`, the
  artifacts, the code bundles or the database, is left out (`python_paths`);
- read-only too: the folders of the jobs it waited for (`after`), at `/inputs/job-<id>`,
  where its owner may read them;
- read-write: the job's own artifact folder, shown at `/job` (`JOB_PATH`, also its working
  folder: the same path for every job, so a trainer's view does not depend on which job it
  runs, and a warm trainer can be started before its job is known, `worker.pool`), and a
  private `/tmp` of at most `TOWERQ_TRAINER_TMP_MB` (it lives in memory);
- devices: a minimal `/dev`, plus the NVIDIA device nodes of its GPUs only;
- processes: a pid namespace of its own (bwrap's init is pid 1, the trainer pid 2): user
  code sees and signals only its own processes, and when the trainer ends the kernel kills
  whatever it left behind there, `setsid()` children too, since nothing leaves a pid
  namespace. The worker finds the trainer's host pids (NVML reports those) as the
  descendants of bwrap (`worker.processes.descendants`), never from what the trainer says;
- network: none but its own loopback (names looked up in `/etc/hosts` alone, never a DNS
  server it cannot reach: `worker.sandbox_names`), unless the job asks (`network: true`:
  then it shares the host's network and reaches what the host reaches, Redis and the
  database included, so those must ask for a password; `towerq up`'s own Redis does). A
  rank of a job over several hosts reaches the other ranks through its worker
  (`worker.trainer.tunnel`, its control socket at `RANKS_PATH`), not through the network;
- privileges: never host root. The trainer runs as an unprivileged host user whatever
  user the worker is: a root worker's bwrap keeps only the right to change users, and
  starts the trainer through `setpriv` as `TOWERQ_TRAINER_UID`:`TOWERQ_TRAINER_GID`
  (`nobody` by default), with no supplementary groups, no capabilities (bounding set
  included) and no new privileges; a worker that is not root runs bwrap unprivileged, in a
  user namespace of its own (`--unshare-user`, no nested ones: `--disable-userns`), so the
  trainer is the worker's own user. Either way root's files (`/etc/shadow`), sysctls and
  devices are not the trainer's. The job's folder (and a warm trainer's, and a rank's
  control socket) is handed to the trainer's user (`hand_over`). A host where this cannot
  run (no `setpriv`, or no user namespaces for an unprivileged worker) gets a worker that
  refuses to start and says so, as for a missing bubblewrap;
- kernel and host interfaces: `/proc/sys` (and `/proc/sysrq-trigger`) read only, whatever
  the uid (a sysctl written by root inside used to be the host's: `kernel.core_pattern`
  ran a program as host root); `/sys/fs/cgroup` is an empty read-only folder and the
  trainer has a cgroup namespace of its own (`/proc/self/cgroup` says `/`), so no other
  job's cgroup, name or host pid shows; `/dev` is read only but for its own `/dev/shm` of
  `TOWERQ_TRAINER_TMP_MB`, so nothing unbounded is writable there (a job wrote 1.5 GB into
  `/dev`). Still visible: `/proc/self/mountinfo` names the host path of each folder shown
  (the job folder's too where it is not a disk image of its own, `worker.disk`), which says
  where towerq keeps its files but gives no way to them.

Not visible: the database file and the rest of `TOWERQ_VAR_DIR`, other jobs' artifacts,
other users' datasets and code bundles, the checkout the worker runs from, home folders,
other processes. The environment is already an allow-list
(`worker.launch.trainer_environment`), so no credentials travel with it. A program's own
(a command job's, a notebook session's: the member's `env`) never reaches bwrap or setpriv,
which run as root: it comes on stdin, after the drop (`worker.sandbox_env`).

bwrap stays as the trainer's parent and leads its process group; a stop request (SIGTERM)
goes to the rest of the group, not to bwrap, which would die of it and take the trainer
with it (`--die-with-parent`) before it could checkpoint (`worker.attempt`); bwrap's init
inside ignores it.

`TOWERQ_SANDBOX`: `auto` (default: bwrap where it is installed and works; where it does not,
the worker refuses to start and says why: user code must not run unsandboxed by
accident), `bwrap` (the same, said explicitly), `none` (an admin's choice to run user code
unsandboxed: said loudly in the worker's log, the GPUs page and `towerq gpus`).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from worker.sandbox_names import offline_names

log = logging.getLogger(__name__)

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
NVIDIA_SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
SANDBOX_KINDS = ("auto", "bwrap", "none")
JOB_PATH = Path("/job")
"""Where a sandboxed trainer sees its job folder."""
RANKS_PATH = Path("/ranks")
"""A rank of a job over several hosts: where it sees its worker's control socket (`worker.trainer.tunnel`)."""
CODE_PATH = Path("/code")
"""Where a job's code bundle is seen, read only (a command job's working folder)."""


class SandboxError(RuntimeError):
    """TOWERQ_SANDBOX=bwrap on a host where bubblewrap cannot run."""


Identity = tuple[int, int]
"""The host (uid, gid) a root worker runs trainers as."""


def trainer_identity(uid: int, gid: int) -> Identity | None:
    """Who bwrap and the trainer run as on the host: (`uid`, `gid`) for a root worker, None
    (the worker's own user, which is not root) otherwise."""
    return (uid, gid) if os.geteuid() == 0 else None


def drop_to(identity: Identity | None) -> list[str]:
    """What starts the trainer's command as `identity`, inside a root worker's bwrap (which
    kept CAP_SETUID, CAP_SETGID and CAP_SETPCAP for it, `privileges`): no supplementary
    groups, no capabilities left, not even in the bounding set, and no way back to
    privileges (setuid binaries and file capabilities do nothing). Nothing for None."""
    if identity is None:
        return []
    uid, gid = identity
    return [
        tool("setpriv"), f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
    ]  # fmt: skip


def privileges(identity: Identity | None) -> list[str]:
    """bwrap's options on who runs inside: see the module's docstring."""
    if identity is None:  # bwrap runs unprivileged: a user namespace of its own
        return ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    keep = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # for `drop_to`, which gives them up
    return ["--cap-drop", "ALL", *(arg for cap in keep for arg in ("--cap-add", cap))]


def system_view() -> list[str]:
    """bwrap's options that show the host's system folders (`SYSTEM_PATHS`) read-only, a
    link as the same link."""
    args: list[str] = []
    for system in SYSTEM_PATHS:
        path = Path(system)
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), system]
        elif path.exists():
            args += ["--ro-bind", system, system]
    return args


def tool(name: str) -> str:
    """The absolute path of one of towerq's own tools (bwrap, setpriv), found on the worker's
    `PATH`. Never by name: bwrap starts with the program's environment, and a job's `env`
    may set `PATH`, so a name would be looked up there (by the worker, as root, for bwrap;
    by bwrap, inside, for setpriv), where the job may have left a program of that name."""
    found = _which(name)
    if found is None:
        raise SandboxError(f"{name} is not installed on this host")
    return found


@functools.cache
def _which(name: str) -> str | None:
    found = shutil.which(name)
    return str(Path(found).resolve()) if found else None


@functools.cache
def bwrap_works(identity: Identity | None = None) -> str | None:
    """None when bwrap runs a command here as a trainer would run (as `identity`, seeing
    the system a trainer sees), else why not. Not the whole tree (`--ro-bind / /`): bwrap
    copies every mount under what it shows, and one that goes away meanwhile (a
    neighbouring job's disk, unmounted and its folder removed) fails it ("Unable to apply
    mount flags", bubblewrap issue 650), which refused to start a worker."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bubblewrap is not installed (apt install bubblewrap)"
    if identity is not None and shutil.which("setpriv") is None:
        return "setpriv is not installed (apt install util-linux)"
    probe = [binary, *privileges(identity), "--unshare-pid", "--unshare-cgroup", *system_view()]
    probe += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev", "--die-with-parent"]
    probe += ["--", *drop_to(identity), "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap failed: {err}"
    if done.returncode == 0:
        return None
    why = f"bwrap cannot run here as a trainer would ({done.stderr.strip()[:300]})"
    if identity is None:
        why += ": a worker that is not root needs user namespaces (sysctl user.max_user_namespaces > 0)"
    return why


UNSANDBOXED_WARNING = (
    "TRAINERS RUN WITHOUT A SANDBOX (TOWERQ_SANDBOX=none): every member's code runs as the worker's user, "
    "with its files, its processes and its network (the database, Redis, other jobs)"
)


def resolve(kind: str, identity: Identity | None = None) -> bool:
    """Whether trainers run in the sandbox, for the setting `kind`, as `identity`
    (`trainer_identity`); SandboxError when they should and cannot (fail closed: `none` is
    the only way to run them unsandboxed)."""
    if kind not in SANDBOX_KINDS:
        raise SandboxError(f"TOWERQ_SANDBOX is {kind!r}: use {', '.join(SANDBOX_KINDS)}")
    if kind == "none":
        log.warning(UNSANDBOXED_WARNING)
        return False
    why_not = bwrap_works(identity)
    if why_not is None:
        return True
    raise SandboxError(
        f"trainers must run in a sandbox and {why_not}; install bubblewrap (scripts/setup-system --run), "
        "or, to run members' code unsandboxed knowingly, set TOWERQ_SANDBOX=none"
    )


def python_paths(repo_root: Path, protected: Iterable[Path] = ()) -> list[Path]:
    """What the trainer's Python needs: its installation (the prefixes) and the folders on
    this process's import path (site-packages, `.pth` additions). Left out: the folder the
    worker was started in (`python -m` puts it first on the path: a lab's folder with its
    `var/`), a source checkout but for its `worker` and `towerq` packages (the trainer and
    the job-spec contract) and `.venv`, and any path that
    holds one of `protected` (towerq's state: its database, artifacts, code bundles)."""
    checkout = (repo_root / "pyproject.toml").is_file()
    prefixes = [Path(p).resolve() for p in dict.fromkeys((sys.prefix, sys.base_prefix, sys.exec_prefix)) if p]
    started_in = {Path.cwd().resolve(), Path(sys.path[0] or ".").resolve()} if sys.path else {Path.cwd().resolve()}
    guarded = [path.resolve() for path in protected]
    shown = [repo_root / "worker", repo_root / "towerq"]  # the trainer, and the contract it reads
    candidates = list(shown) if checkout else []
    candidates += prefixes + [Path(entry).resolve() for entry in sys.path if entry]
    found: list[Path] = []
    for path in candidates:
        in_prefix = any(path == prefix or prefix in path.parents for prefix in prefixes)
        if path in started_in and not in_prefix:
            continue
        if checkout and repo_root in [path, *path.parents] and path not in shown and not in_prefix:
            continue  # another folder of the checkout: not needed, maybe not safe
        if any(path == held or path in held.parents for held in guarded):
            log.warning("not shown to trainers: %s holds towerq's own files", path)
            continue
        if path.exists() and path not in found:
            found.append(path)
    return found


def dataset_folders(data_dir: Path, paths: Iterable[str]) -> list[Path]:
    """The upload folders (`users/<user>/<name>`) the job's dataset paths lie in."""
    folders = []
    for relative in paths:
        parts = Path(relative).parts
        if len(parts) >= 3 and parts[0] == "users":
            folder = data_dir.resolve() / parts[0] / parts[1] / parts[2]
            if folder.is_dir() and folder not in folders:
                folders.append(folder)
    return folders


def gpu_nodes(indices: list[int]) -> list[Path]:
    """The device nodes of these GPUs (by their minor numbers, from NVML) and the shared ones."""
    nodes = [Path("/dev") / name for name in NVIDIA_SHARED_NODES]
    minors = list(indices)
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            minors = [pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver: simulated GPUs have no nodes anyway
        pass
    nodes += [Path(f"/dev/nvidia{minor}") for minor in minors]
    return [node for node in nodes if node.exists()]


def bwrap_command(
    command: list[str],
    *,
    job_folder: Path,
    repo_root: Path,
    models_path: Path,
    data_dir: Path,
    datasets: list[Path],
    code_path: Path | None,
    devices: list[Path],
    identity: Identity | None,
    protected: Iterable[Path] = (),
    network: bool = False,
    tmp_mb: int = 1024,
    inputs: Iterable[tuple[Path, Path]] = (),
    gate: Path | None = None,
    workdir: Path | None = None,
    binds: Iterable[tuple[Path, Path]] = (),
    read_only: Iterable[Path] = (),
    own_folder: Path | None = None,
) -> list[str]:
    """`command` wrapped in bwrap with the view described above, run as `identity`
    (`trainer_identity`) in `workdir` (default `JOB_PATH`); `job_folder` is seen at
    `JOB_PATH`; `protected` are towerq's own folders and files, never shown; `own_folder`
    holds what towerq makes for a sandbox to see (without network, its name switch:
    `worker.sandbox_names`)."""
    args = [tool("bwrap"), "--die-with-parent", *privileges(identity)]
    args += ["--unshare-ipc", "--unshare-uts", "--unshare-pid", "--unshare-cgroup"]
    if not network:
        args.append("--unshare-net")
    args += system_view()
    if not network and own_folder is not None:
        args += offline_names(own_folder)
    args += ["--tmpfs", "/sys/fs/cgroup", "--remount-ro", "/sys/fs/cgroup"]  # no other job's cgroup
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]  # no sysctl is the trainer's
    if Path("/proc/sysrq-trigger").exists():
        args += ["--ro-bind", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    size = str(tmp_mb * 2**20)
    writable = ["--perms", "01777", "--size", size, "--tmpfs"]  # anyone's (the trainer's user), sticky
    args += ["--dev", "/dev", *writable, "/dev/shm"]
    for device in devices:  # before /dev is read only: bwrap makes a file for each to bind over
        args += ["--dev-bind", str(device), str(device)]
    args += ["--remount-ro", "/dev"]
    args += [*writable, "/tmp", "--setenv", "HOME", "/tmp"]
    for path in python_paths(repo_root, protected):
        args += ["--ro-bind", str(path), str(path)]
    for shared in (models_path.resolve(), data_dir.resolve()):
        if shared.exists():
            args += ["--ro-bind", str(shared), str(shared)]
    users = data_dir.resolve() / "users"
    if users.is_dir():
        args += ["--tmpfs", str(users)]  # every upload hidden ...
        for folder in datasets:  # ... but the job's own
            args += ["--ro-bind", str(folder), str(folder)]
    if code_path is not None:
        args += ["--ro-bind", str(code_path), str(CODE_PATH)]
    for folder in read_only:  # a command job's Python environment, where it was built
        args += ["--ro-bind", str(folder), str(folder)]
    for folder, seen in inputs:  # the folders of the jobs it waited for, read-only
        args += ["--ro-bind", str(folder.resolve()), str(seen)]
    if gate is not None:  # a rank's way to the other ranks: its worker's control socket, read-only
        args += ["--ro-bind", str(gate), str(RANKS_PATH)]
    args += ["--bind", str(job_folder), str(JOB_PATH)]
    for folder, seen in binds:  # a notebook session's own: its member's folder, its socket's
        args += ["--bind", str(folder), str(seen)]
    args += see_through(args)
    args += ["--chdir", str(workdir or JOB_PATH)]
    return [*args, "--", *drop_to(identity), *command]


HOST_OPTIONS = ("--bind", "--ro-bind", "--dev-bind", "--symlink")
"""bwrap's options that show something of the host at their second argument."""
KERNEL_OPTIONS = ("--dev", "--proc")
"""... and those that mount the kernel's own at their first."""


def see_through(args: list[str]) -> list[str]:
    """`--chmod 0755` for each folder bwrap made above a folder it shows (it gives them the
    mode of the host's: a Python under `/root`, or a lab's folder in a 0700 one, would be out
    of the trainer's reach otherwise). Only folders bwrap made are changed, never one it
    shows (a host folder, a link, a tmpfs such as `/tmp`, `/proc` or `/dev`)."""
    host: set[Path] = set()
    mounted: set[Path] = set()
    for i, arg in enumerate(args):
        if arg in HOST_OPTIONS or arg in KERNEL_OPTIONS:
            host.add(Path(args[i + 1] if arg in KERNEL_OPTIONS else args[i + 2]))
        elif arg == "--tmpfs":
            mounted.add(Path(args[i + 1]))
    shown = host | mounted

    def on_bwraps_own(folder: Path) -> bool:  # the nearest mount above it is a tmpfs, or bwrap's root
        above = [mount for mount in shown if mount in folder.parents]
        return not above or max(above, key=lambda mount: len(mount.parts)) in mounted

    made = {
        parent
        for path in shown
        for parent in path.parents
        if parent != Path("/") and parent not in shown and on_bwraps_own(parent)
    }
    return [arg for folder in sorted(made) for arg in ("--chmod", "0755", str(folder))]


def hand_over(path: Path, identity: Identity | None) -> None:
    """Make `path` (a job's folder, a warm trainer's, a rank's control socket) the trainer's
    own, so that it can write there; itself only, never what is in it (a trainer may have
    put links there) and never through a link."""
    if identity is not None:
        os.chown(path, *identity, follow_symlinks=False)
