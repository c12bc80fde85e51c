"""A notebook session (`"kind": "notebook"`): JupyterLab on the job's GPUs, run as a command
job's program is run (its sandbox, cgroups, `CUDA_VISIBLE_DEVICES`, the lab's Python as its
kernel), reached only through towerq's API, and ended when idle.

What the session sees, besides a command job's view (`worker.program`):

- its member's folder (`TOWERQ_ARTIFACTS_DIR/homes/user-<id>`, kept across sessions, at
  most `TOWERQ_NOTEBOOK_HOME_MAX_BYTES`) at `HOME_PATH`: JupyterLab's root and `$HOME`;
- the session's own folder (`TOWERQ_VAR_DIR/sessions/job-<id>-<attempt>`) at
  `SESSION_PATH`, where JupyterLab listens on a unix socket (`SOCKET`) and keeps its runtime
  files. No TCP port: the sandbox has no network of its host, and the socket is in no folder
  anyone but the worker and the session reaches;
- its code bundle, when it names one, read-only at `TOWERQ_CODE_DIR` (on `PYTHONPATH`).

The way in is the session's door (`worker.door.Door`): a TCP port of `TOWERQ_RANK_PORTS` on the worker's
host (on a Slurm node, the node's), recorded with a secret of the attempt where the ranks of
a job meet (`RankAddress`, rank 0, in the database, which only towerq's processes reach),
through the attempt's channel (`open_door`: a Slurm node says it to the API). The API connects, proves it
knows the secret (`towerq.contract.handshake`, label `session`), and the door pipes the
connection to the socket, opened without following a link and only when it is a socket of
the session's user (`worker.door.open_socket`): what the session put there in its place (a link to
another socket) is refused. The API proxies the member's requests through it
(`service.api.routes.sessions`), so JupyterLab has no token of its own.

Idle: no connection through the door, no kernel busy (JupyterLab's word, asked through the
socket), and, where NVML reports one, none of its GPUs in use, for `idle_timeout_s`. Then it
is stopped as a cancelled job is (SIGTERM: JupyterLab shuts its kernels down) and ends
`succeeded`, with the reason "idle for N min". A session is never requeued: a stop of the
worker ends it (`cancelled`); its member's folder stays.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from service.core.settings import Settings
from towerq.contract.api import SHELL_INPUT_VARIABLE
from towerq.contract.attempts import AttemptEnd, Refused
from towerq.contract.times import span_text
from worker import pyenv, rendezvous, sandbox
from worker.attempt import Starter
from worker.cgroups import AttemptGroup
from worker.door import SOCKET, Door, ask
from worker.folder import FolderWatch, size_words
from worker.gpu_use import gpus_in_use
from worker.launch import code_seen, in_sandbox, trainer_user
from worker.outcome import NotStarted, Stop
from worker.program import (
    ProgramRunner,
    prepare_folders,
    program_environment,
    program_pythonpath,
)

HOME_PATH = Path("/home/towerq")
"""Where a sandboxed session sees its member's folder."""
SESSION_PATH = Path("/run/towerq")
"""Where a sandboxed session sees its own folder (its socket, JupyterLab's runtime files)."""
PIPED_SHELL = "stty -echo -onlcr; printf '\\033]7777;towerq-input\\007'; cat | /bin/bash"
"""A terminal's shell for piped input (`towerq shell < script`): bash reads the script as
`ssh host bash < script` does, without prompts or echo, and a program it runs reads the rest
of the script as its stdin. `cat` reads the terminal in canonical mode throughout, so the
Ctrl+D at the end of the input is always its end, never a byte read in raw mode by readline.
It says it reads (a string command, not drawn) once its terminal's echo is off: the input
waits for that, or the terminal would echo what came before."""
TERMINAL_SHELL = (
    f'if [ "${SHELL_INPUT_VARIABLE}" = piped ]; then {PIPED_SHELL}; else /bin/bash; fi; '
    'status=$?; printf "\\033]7777;towerq-exit=%d\\007" "$status"; exit "$status"'
)
"""A terminal's shell: bash, not a login shell (/etc/profile would set PATH again, and
`python` would not be the lab's, with its frameworks, but the system's, or none), or the
piped one where its opener says its input is piped; then its exit status, as a string
command a terminal does not show (`towerq shell` exits with it)."""
IDLE_CHECK_S = 5.0
"""How often the worker asks JupyterLab whether a kernel is busy."""
OVER_QUOTA_SLACK_BYTES = 1_000_000
"""How much a member's folder that is over its quota when a session starts may still grow in
that session: JupyterLab (as it starts) and the kernel keep their own state in `$HOME`
(command history, notebook signatures, workspaces, a folder's blocks), which grows as the
member works, deleting files included. Small beside any quota; a file of the member's own
soon passes it."""


def why_no_sessions(sandboxed: bool) -> str | None:
    """Why this host cannot run notebook sessions (its worker says it when it registers, the
    API at submit where no host can); None where it can."""
    if importlib.util.find_spec("jupyterlab") is None:
        return "JupyterLab is not installed in its worker's Python (pip install 'towerq[notebook]')"
    if not sandboxed and os.geteuid() == 0:
        return (
            "its worker runs as root without the sandbox (TOWERQ_SANDBOX=none, or no bubblewrap): "
            "a session's terminal would be a root shell on the host"
        )
    return None


def home_folder(settings: Settings, user_id: int) -> Path:
    """The member's notebook folder, kept across their sessions (on the shared storage)."""
    return settings.artifacts_dir.resolve() / "homes" / f"user-{user_id}"


def session_folder(settings: Settings, job_id: int, attempt: int) -> Path:
    return settings.var_dir.resolve() / "sessions" / f"job-{job_id}-{attempt}"


def session_base_url(settings: Settings, job_id: int) -> str:
    """The path JupyterLab serves under: the API's, as the browser sees it."""
    return f"{settings.root_path}/sessions/{job_id}/"


class HomeQuota:
    """`TOWERQ_NOTEBOOK_HOME_MAX_BYTES` in one session. Under it at the first measure, the
    folder may grow up to it; over it (files kept from before), the member may delete files
    but not add more: the folder may not grow past the least it has held since, plus
    `OVER_QUOTA_SLACK_BYTES` for JupyterLab's and the kernel's own state (nor need it stay
    under the quota, where that is more)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.ceiling: int | None = None
        """The most the folder may hold in this session, set at the first measure."""

    def judge(self, used: int) -> tuple[str | None, str | None]:
        """(a warning for the member, the reason to stop the session) with the folder at `used`."""
        most = self.max_bytes
        if not most:
            return None, None
        if self.ceiling is None:
            self.ceiling = most if used <= most else used + OVER_QUOTA_SLACK_BYTES
            if used > most:
                return f"your notebook folder holds {size_words(used)}, over its {size_words(most)}: delete some", None
            return None, None
        if used <= self.ceiling:  # what it deleted, it may not add again past the quota
            self.ceiling = min(self.ceiling, max(most, used + OVER_QUOTA_SLACK_BYTES))
            return None, None
        why = f"your notebook folder grew to {size_words(used)}, over its {size_words(most)}"
        if self.ceiling > most:
            why += f" and past the {size_words(self.ceiling)} this session allows (what it held, and a little)"
        return None, why + " (TOWERQ_NOTEBOOK_HOME_MAX_BYTES)"


def jupyter_command(
    settings: Settings, job_id: int, home: Path, session: Path, python: str = sys.executable
) -> list[str]:
    """JupyterLab on the session's socket, under the API's path, without a token (the API
    is the only way in and checks the member's login), `HOME` the member's folder; its
    terminals' shell sees the session's environment (the lab's Python first on PATH). `env`
    by its path, as towerq's other tools: not looked up on the member's `PATH`."""
    # on an environment of its requirements (`worker.pyenv`), Jupyter still finds the lab's
    # server extensions (terminals), lab extensions and kernel specs, where the lab installed them
    lab = [f"JUPYTER_CONFIG_PATH={sys.prefix}/etc/jupyter", f"JUPYTER_PATH={sys.prefix}/share/jupyter"]
    return [
        sandbox.tool("env"), f"HOME={home}", f"JUPYTER_RUNTIME_DIR={session / 'runtime'}", "SHELL=/bin/bash",
        *(lab if python != sys.executable else []), python, "-m", "jupyterlab", "--no-browser",
        f"--ServerApp.sock={session / SOCKET}", "--ServerApp.sock_mode=0600",
        f"--ServerApp.base_url={session_base_url(settings, job_id)}",
        f"--ServerApp.root_dir={home}", "--IdentityProvider.token=", "--ServerApp.password=",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--ServerApp.terminado_settings", f"shell_command=/bin/bash -c {shlex.quote(TERMINAL_SHELL)}",
    ]  # fmt: skip


class NotebookRunner(ProgramRunner):
    """An attempt of a notebook session."""

    session = True

    door: Door | None = None
    _ready = False
    _busy_at = 0.0
    """When a kernel was last busy, or a GPU in use (monotonic)."""
    _next_ask = 0.0
    _home_watch: FolderWatch | None = None
    _home_quota: HomeQuota
    _started_at = 0.0
    socket_folder: Path | None = None
    """The session's own folder (`session_folder`), once made."""
    owner = 0
    """The uid the session runs as (who may own its socket)."""
    door_host = ""
    """The door's host as told to the API: on a Slurm node, the node's name (the API takes
    no other, and reaches it at the address Slurm gives it); else this host's address
    (`worker.rendezvous.address`)."""
    door_listen = ""
    """Where the door listens, where not at `door_host`: on a Slurm node, its address as
    Slurm says it (`service.core.slurm_nodes`), where the API reaches it."""

    def _prepare(self) -> Starter:
        settings, launch = self.settings, self.launch
        why_not = why_no_sessions(self.sandboxed)
        if why_not is not None:
            raise NotStarted(Stop.CANNOT_HERE, f"{launch.host} runs no notebook sessions: {why_not}")
        identity = trainer_user(settings) if self.sandboxed else None
        self.owner = identity[0] if identity is not None else os.geteuid()
        prepare_folders(self.artifacts, identity)
        home = home_folder(settings, launch.user_id)
        home.mkdir(parents=True, exist_ok=True)
        if home.is_symlink() or not home.is_dir():
            raise sandbox.SandboxError("the member's notebook folder is not a folder")
        sandbox.hand_over(home, identity)
        self.socket_folder = folder = session_folder(settings, launch.job_id, launch.attempt)
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        sandbox.hand_over(folder, identity)
        seen_home, seen_session = (HOME_PATH, SESSION_PATH) if self.sandboxed else (home, folder)
        self._python_env()
        seen_job = sandbox.JOB_PATH if self.sandboxed else self.artifacts
        env = program_environment(launch, settings, seen_job, self.sandboxed, self.python_env)
        code = code_seen(launch, settings, self.sandboxed)
        if code is not None:  # importable after towerq's folders (`import towerq` stays), before the job's own
            env["TOWERQ_CODE_DIR"] = str(code)
            env["PYTHONPATH"] = program_pythonpath(launch, code)
        # its requirements' environment runs JupyterLab, so its kernel is that Python too
        python = str(self.python_env / "bin" / "python") if self.python_env is not None else sys.executable
        command = jupyter_command(settings, launch.job_id, seen_home, seen_session, python)
        if self.sandboxed:
            binds = [(home, HOME_PATH), (folder, SESSION_PATH)]
            shown = [self.python_env] if self.python_env is not None else []
            network = bool(launch.spec.get("network"))
            command = in_sandbox(
                command, launch, settings, self.artifacts, network, HOME_PATH, binds, shown, environment_on_stdin=True
            )
        self._home_watch = FolderWatch(home, settings.notebook_home_max_bytes, settings.job_folder_check_s)
        self._home_quota = HomeQuota(settings.notebook_home_max_bytes)
        self._open_door(folder)

        def start(group: AttemptGroup) -> tuple[subprocess.Popen[bytes], dict[str, str], str]:
            self._started_at = time.monotonic()
            return self._start_program(command, home, env, group), env, "JupyterLab"

        return start

    def _open_door(self, folder: Path) -> None:
        """The session's door, listening and recorded; `NotStarted` (the session queued
        again, saying why) where it cannot open here or towerq does not take it."""
        settings, launch = self.settings, self.launch
        here = self.door_host or rendezvous.address(settings)
        listen = self.door_listen or here
        first = rendezvous.first_port_tried(settings, launch.job_id, launch.attempt)
        key = secrets.token_hex(32)
        try:
            door = Door(listen, rendezvous.free_port(settings, listen, first), key, folder, self.owner)
        except (rendezvous.RendezvousError, OSError) as err:
            raise NotStarted(Stop.NO_DOOR, f"its door could not open on {listen}: {err}") from err
        told = f"{here}:{door.port}"
        try:
            self.channel.open_door(told, key)
        except Refused as err:
            door.close()
            raise NotStarted(Stop.NO_DOOR, f"towerq did not take its door on {told}: {err}") from err
        self.door = door

    def _watch(self) -> None:
        super()._watch()
        now = time.monotonic()
        door = self.door  # shut (None) by the end, perhaps meanwhile
        if now < self._next_ask or door is None or self.socket_folder is None:
            return
        self._next_ask = now + IDLE_CHECK_S
        self._watch_home(now)  # first at the start, before the member can add anything
        try:
            kernels = ask(
                self.socket_folder,
                self.owner,
                f"{session_base_url(self.settings, self.launch.job_id)}api/kernels?no_track_activity=1",
            )
        except (OSError, ValueError):
            kernels = None
        if not self._ready:
            self._wait_ready(kernels is not None, now)
            return
        busy = isinstance(kernels, list) and any(
            isinstance(k, dict) and k.get("execution_state") == "busy" for k in kernels
        )
        if busy or self._gpus_in_use():
            self._busy_at = now
        idle_s = min(door.idle_for(now), now - self._busy_at)
        timeout = self.launch.spec.get("idle_timeout_s") or self.settings.notebook_idle_timeout_s
        if idle_s >= timeout and self.outcome.stop is None:
            self.request_stop(Stop.IDLE, f"idle for {span_text(idle_s)}: ended, its GPUs freed")
            self.sink.log("info", f"the session was idle for {span_text(idle_s)} (idle_timeout_s {timeout}): it ends")

    def _wait_ready(self, answered: bool, now: float) -> None:
        if answered:
            self._ready = True
            self._busy_at = now
            self.sink.log("info", f"JupyterLab is ready: open {session_base_url(self.settings, self.launch.job_id)}lab")
            return
        if self.python_env is not None and not (self.python_env / pyenv.READY).is_file():
            self._started_at = now  # its requirements are being installed: JupyterLab starts after
            return
        waited = now - self._started_at
        if waited > self.settings.notebook_start_timeout_s and self.outcome.stop is None:
            self.request_stop(Stop.NOT_READY, f"JupyterLab did not answer within {waited:.0f} s of its start")

    def _watch_home(self, now: float) -> None:
        watch = self._home_watch
        if watch is None or not watch.due(now):
            return
        watch.measure(now, self._live_pids())
        warning, stop = self._home_quota.judge(watch.bytes or 0)
        if warning is not None:
            self.sink.log("warning", warning)
        if stop is not None and self.outcome.stop is None:
            self.request_stop(Stop.FOLDER_FULL, f"stopped: {stop}; its files are kept")

    def _gpus_in_use(self) -> bool:
        """Where NVML reports utilization: one of its GPUs in use (on a shared GPU, only
        while a process of the session is on it, by its own part of the GPU's use)."""
        if self.inventory.simulated:
            return False
        self._note_pids()
        return gpus_in_use(self.inventory.refresh(), self.launch.indices, self.launch.fraction, self.trainer_pids)

    def _record(self, end: AttemptEnd) -> None:
        self._shut_door()  # first: over HTTP, the attempt's token ends with its end
        super()._record(end)

    def _shut_door(self) -> None:
        if self.door is None:
            return
        self.door.close()
        self.door = None
        with contextlib.suppress(Exception):  # the job's end makes it useless anyway
            self.channel.close_door()

    def _after(self) -> None:
        super()._after()
        self._shut_door()
        if self.socket_folder is not None:  # its socket, JupyterLab's runtime files (rmtree follows no link)
            shutil.rmtree(self.socket_folder, ignore_errors=True)
