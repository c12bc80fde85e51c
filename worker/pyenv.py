"""A command job's own packages (`"requirements"` in its spec): a Python environment over
the lab's, built once on each host for each list, kept, and shared by the jobs that ask for
the same list (as ClearML's agent caches a task's virtual environment).

The environment is a venv at `TOWERQ_VAR_DIR/envs/<key>`: its own site-packages first, then the
lab's (`towerq-lab.pth` adds the lab's site folders, their `.pth` files included), so the
lab's frameworks stay importable and a version the list names replaces the lab's. The
program finds its `python` first on `PATH`.

What a member names cannot run anything here: pip installs wheels only (`--only-binary
:all:`: an sdist's `setup.py` would run as the worker's user), from the lab's index (pip's
own config, and `TOWERQ_PIP_OPTIONS`: `--index-url URL`, `--no-index --find-links DIR`),
in an empty folder with the list after `--` (no entry is read as an option or a local
path; `towerq.contract.program_env.requirement` refuses those at submit too). Jobs see
their environment read only (bound at its own path in the sandbox; they run as another user
than the worker that built it), so no job changes what the next one with the same list
runs.

The key is the list (sorted, as written), the lab's Python and the options. The first job
builds it under a lock (a second on the same host waits, then reuses it); each job holds it
(a shared `flock` on its `.ready`) while it runs. At most `TOWERQ_ENVS_MAX` are kept: past
that, the least recently used that no job holds are removed."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shlex
import shutil
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from service.core.settings import Settings
from worker.outcome import NotStarted, Stop

ENVS = "envs"
"""The folder of `TOWERQ_VAR_DIR` the environments are kept in (this host's own)."""
READY = ".ready"
"""Written last: the environment is whole. Its mtime is when a job last used it."""
PIP_LEVELS = {"ERROR": "error", "WARNING": "warning"}
PIP_LINES_LOGGED = 200
"""pip's lines a build logs at most (the rest are counted); its last error is the reason."""


@dataclass
class PythonEnv:
    folder: Path
    held: IO[str]
    """`.ready`, open with a shared lock while the job runs: pruning passes it by."""

    @property
    def bin(self) -> Path:
        return self.folder / "bin"

    def release(self) -> None:
        self.held.close()


def env_key(requirements: list[str], pip_options: str) -> str:
    said = json.dumps([sorted(requirements), sys.version, sys.executable, pip_options])
    return hashlib.sha256(said.encode()).hexdigest()[:24]


def ensure(requirements: list[str], settings: Settings, say: Callable[[str, str], None]) -> PythonEnv:
    """The environment for `requirements` on this host, built if it is not yet, and held."""
    root = (settings.var_dir / ENVS).resolve()
    root.mkdir(parents=True, exist_ok=True)
    key = env_key(requirements, settings.pip_options)
    folder = root / key
    with open(root / f"{key}.lock", "a") as lock:
        if not _locked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB):
            say("info", "its Python environment is being built on this host for another job: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / READY).is_file():
            say("info", f"its requirements are installed on this host already (environment {key[:12]})")
        else:
            _build(folder, requirements, settings, say)
        held = open(folder / READY)  # noqa: SIM115 - held while the job runs, closed by `release`
        fcntl.flock(held, fcntl.LOCK_SH)
    (folder / READY).touch()
    prune(root, settings.envs_max, keep=key)
    return PythonEnv(folder, held)


def _build(folder: Path, requirements: list[str], settings: Settings, say: Callable[[str, str], None]) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # a build cut short
    started = time.monotonic()
    count = f"{len(requirements)} requirement{'s' if len(requirements) > 1 else ''}"
    say("info", f"installing {count} on this host, once: {' '.join(requirements)}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True)
    purelib = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    lab = [path for path in site.getsitepackages() if Path(path).is_dir()]
    (purelib / "towerq-lab.pth").write_text("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in lab) + "\n")
    command = [
        sys.executable, "-m", "pip", "--python", str(folder / "bin" / "python"), "install", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off", "--only-binary", ":all:",
        *shlex.split(settings.pip_options), "--", *requirements,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="towerq-pip-") as empty:
        pip = subprocess.Popen(command, cwd=empty, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert pip.stdout is not None
        lines = 0
        last_error = ""
        for line in pip.stdout:
            line = line.rstrip()
            if line.startswith(("ERROR:", "error:")):
                last_error = line[len("error:") :].strip()
            if line and lines < PIP_LINES_LOGGED:
                say(PIP_LEVELS.get(line.split(":", 1)[0], "info"), f"pip: {line}")
            lines += 1
        code = pip.wait()
    if code != 0:
        shutil.rmtree(folder, ignore_errors=True)
        why = last_error or f"pip exited with code {code}"
        raise NotStarted(Stop.REQUIREMENTS, f"its requirements could not be installed: {why}")
    (folder / "requirements.txt").write_text("".join(f"{line}\n" for line in requirements))
    (folder / READY).write_text(json.dumps({"requirements": requirements, "built_s": time.monotonic() - started}))
    if lines > PIP_LINES_LOGGED:
        say("info", f"pip: ({lines - PIP_LINES_LOGGED} more lines)")
    say(
        "info",
        f"installed in {time.monotonic() - started:.0f} s (environment {folder.name[:12]}, kept for the next job)",
    )


def prune(root: Path, keep_at_most: int, keep: str) -> list[str]:
    """Remove the least recently used environments past `keep_at_most`, but `keep` and those
    a job holds or that are being built; their keys."""
    kept = sorted(
        (ready.parent for ready in root.glob(f"*/{READY}") if ready.parent.name != keep),
        key=lambda folder: (folder / READY).stat().st_mtime,
        reverse=True,
    )
    removed = []
    for folder in kept[max(0, keep_at_most - 1) :]:
        with open(root / f"{folder.name}.lock", "a") as lock:
            if not _locked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB):
                continue
            with open(folder / READY) as ready:
                if not _locked(ready, fcntl.LOCK_EX | fcntl.LOCK_NB):
                    continue
                (folder / READY).unlink()
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


def _locked(file: IO[str], how: int) -> bool:
    with contextlib.suppress(BlockingIOError):
        fcntl.flock(file, how)
        return True
    return False
