"""The trainer's sandbox: what user code can reach on a GPU host.

A trainer runs a user's code, so with bubblewrap (`bwrap`, Debian's `bubblewrap`) it runs
in a mount namespace of its own that shows only what the job needs:

- read-only: the system (`/usr`, `/etc`, ...), the Python environment, towerq's `worker`
  package, `TOWERQ_MODELS_PATH`, the job's own code bundle, and `TOWERQ_DATA_DIR` with
  every user's uploads (`users/`) hidden but the dataset folders the job asked for;
- read-write: the job's own artifact folder, shown at `/job` (`JOB_PATH`, also its working
  folder: the same path for every job, so a trainer's view does not depend on which job it
  runs, and a warm trainer can be started before its job is known, `worker.pool`), and a
  private `/tmp`;
- devices: a minimal `/dev`, plus the NVIDIA device nodes of its GPUs only.

Not visible: the database file and the rest of `TOWERQ_VAR_DIR`, other jobs' artifacts,
other users' datasets and code bundles, the checkout the worker runs from, home folders.
The network is shared (a model may download weights); the environment is already an
allow-list (`worker.launch.trainer_environment`), so no credentials travel with it.

The host's pid namespace is kept, so NVML's pids are the trainer's. bwrap stays as the
trainer's parent and leads its process group; a stop request (SIGTERM) goes to the rest
of the group, not to bwrap, which would die of it and take the trainer with it
(`--die-with-parent`) before it could checkpoint (`worker.runner`).

`TOWERQ_SANDBOX`: `auto` (default: bwrap where it is installed and works, else none, said
in the worker's log), `bwrap` (required: the worker refuses to start without it), `none`.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
NVIDIA_SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
SANDBOX_KINDS = ("auto", "bwrap", "none")
JOB_PATH = Path("/job")
"""Where a sandboxed trainer sees its job folder."""


class SandboxError(RuntimeError):
    """TOWERQ_SANDBOX=bwrap on a host where bubblewrap cannot run."""


@functools.cache
def bwrap_works() -> str | None:
    """None when bwrap runs a command here (user namespaces or setuid allowed), else why not."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bubblewrap is not installed (apt install bubblewrap)"
    probe = [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--die-with-parent", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap failed: {err}"
    return None if done.returncode == 0 else f"bwrap cannot run here: {done.stderr.strip()[:300]}"


def resolve(kind: str) -> bool:
    """Whether trainers run in the sandbox, for the setting `kind`."""
    if kind not in SANDBOX_KINDS:
        raise SandboxError(f"TOWERQ_SANDBOX is {kind!r}: use {', '.join(SANDBOX_KINDS)}")
    if kind == "none":
        return False
    why_not = bwrap_works()
    if why_not is None:
        return True
    if kind == "bwrap":
        raise SandboxError(f"TOWERQ_SANDBOX=bwrap but {why_not}")
    log.warning("trainers run without a sandbox: %s (user code can read what the worker can)", why_not)
    return False


def python_paths(repo_root: Path) -> list[Path]:
    """What the trainer's Python needs: its installation and every folder on this process's
    import path. A source checkout (towerq not installed as a wheel) is shown only as its
    `worker` package and its `.venv`: a checkout also holds `var/`, where a local database
    lives."""
    checkout = (repo_root / "pyproject.toml").is_file()
    found: list[Path] = [repo_root / "worker"] if checkout else []  # PYTHONPATH finds it there
    for entry in [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]:
        if not entry:
            continue
        path = Path(entry).resolve()
        if checkout and path == repo_root:
            path = repo_root / "worker"
        elif checkout and repo_root in path.parents and not path.is_relative_to(repo_root / ".venv"):
            continue  # another folder of the checkout: not needed, maybe not safe
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
) -> list[str]:
    """`command` wrapped in bwrap with the view described above; `job_folder` is seen at
    `JOB_PATH`."""
    args = ["bwrap", "--die-with-parent", "--unshare-ipc", "--unshare-uts"]
    for system in SYSTEM_PATHS:
        path = Path(system)
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), system]
        elif path.exists():
            args += ["--ro-bind", system, system]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--setenv", "HOME", "/tmp"]
    for device in devices:
        args += ["--dev-bind", str(device), str(device)]
    for path in python_paths(repo_root):
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
        args += ["--ro-bind", str(code_path), str(code_path)]
    args += ["--bind", str(job_folder), str(JOB_PATH), "--chdir", str(JOB_PATH)]
    return [*args, "--", *command]
