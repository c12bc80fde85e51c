"""A command job's own packages (`"requirements"` in its spec): a Python environment over
the lab's, built once on each host for each list, kept, and shared by the jobs that ask for
the same list (as ClearML's agent caches a task's virtual environment).

The environment is a venv at `TOWERQ_VAR_DIR/envs/<key>`: its own site-packages first, then
the lab's (`towerq-lab.pth` adds the lab's site folders, their `.pth` files included), so
the lab's frameworks stay importable and a version the list names replaces the lab's. The
program finds its `python` first on `PATH` (`worker.program.program_environment`).

It is built by the attempt's process itself, first (`prefix`): `python -I -m worker.pyenv
... -- COMMAND` runs as the worker's user, outside the sandbox, in the attempt's cgroup and
process group, and once the environment is there execs COMMAND (bwrap, which shows it read
only). So the job is running while pip works (its log shows pip's lines as they come), a
cancel or the worker's end stops pip as it stops a program, and pip's time is the job's.
A job that waits in the queue usually finds its environment built: its host ran this
process for it, with no command, meanwhile (`worker.prepare`).
A list pip cannot install ends it with `NOT_INSTALLED` and the reason on stderr
(`worker.outcome`: the job fails with that reason, and is not tried again).

What a member names cannot run anything here: pip installs wheels only (`--only-binary
:all:`: an sdist's `setup.py` would run as the worker's user), from the lab's index (pip's
own config, and `TOWERQ_PIP_OPTIONS`), in a folder of its own with the list after `--` (no
entry is read as an option or a local path; `towerq.contract.program_env.requirement`
refuses those at submit too). This process reads none of the job's environment: it starts
with a bare one (in the sandbox, the program's is this process's stdin, left unread for the
sandbox's first step as the program's user, `worker.sandbox_env.ENVIRONMENT_STEP`; unsandboxed,
it waits in a file only the worker's user reads, and comes back at the exec), Python in
isolated mode (`-I`), towerq's tools by absolute path, and pip with
an environment of its own (`PASSED_TO_PIP`: what the worker's own environment says of the
network and pip, in the same file, with `TOWERQ_PIP_OPTIONS`). Jobs see their environment
read only, so no job changes what the next one with the same list runs. The options that
take a URL reach pip through a file of its own (`split_options`), not its command line: a
URL may hold the lab's index password, and /proc/PID/cmdline is every local user's.

The key is the list (sorted, as written), the lab's Python and the options. The first job
builds it under a lock (a second on the same host waits, then reuses it); each job holds it
(a shared `flock` on its `.ready`, kept open through the exec) while it runs. At most
`TOWERQ_ENVS_MAX` are kept: past that, the least recently used that no job holds go."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from service.core.lifetime import dies_with_this_process

Starting = tuple[list[str], dict[str, str]]
"""What runs before an attempt's command, and the environment its process starts with."""

ENVS = "envs"
"""The folder of `TOWERQ_VAR_DIR` the environments are kept in (this host's own)."""
READY = ".ready"
"""Written last: the environment is whole. Its mtime is when a job last used it."""
PASSED_TO_PIP = ("HOME", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
PASSED_TO_PIP_PREFIXES = ("PIP_", "SSL_CERT_", "REQUESTS_CA_", "CURL_CA_")
"""What of the worker's own environment pip is started with: its word on the network and pip
(proxies, certificates, `PIP_*`, its `HOME` for pip's user config)."""
NOT_INSTALLED = 86
"""The exit status of an attempt whose requirements pip could not install."""
SAID = "towerq: its requirements could not be installed: "
"""How that attempt's last line on stderr starts (the rest: pip's reason)."""
PIP_LINES_SHOWN = 200
LEFT_BEHIND_S = 3600.0
"""An attempt's environment file is read within a second of its start, and pip's folder
goes with its build: older ones are what an attempt killed meanwhile left."""


class NotInstalled(Exception):
    """pip could not install the list: the message is its reason."""


def root_of(var_dir: Path) -> Path:
    return (var_dir / ENVS).resolve()


def env_key(requirements: list[str], pip_options: str) -> str:
    said = json.dumps([sorted(requirements), sys.version, sys.executable, pip_options])
    return hashlib.sha256(said.encode()).hexdigest()[:24]


def env_folder(var_dir: Path, requirements: list[str], pip_options: str) -> Path:
    """Where the environment of `requirements` is (or will be) on this host."""
    return root_of(var_dir) / env_key(requirements, pip_options)


def prefix(var_dir: Path, requirements: list[str], pip_options: str, keep: int, environ: dict[str, str]) -> Starting:
    """What goes before an attempt's command to build (or reuse) and hold its environment,
    and the environment that process starts with. It reads none of the job's: `environ` (the
    program's) waits in a file only the worker's user reads, for the exec after the build.
    The worker's word for pip (`PASSED_TO_PIP`) waits there with it."""
    root = root_of(var_dir)
    root.mkdir(parents=True, exist_ok=True)
    passed = {k: v for k, v in os.environ.items() if k in PASSED_TO_PIP or k.startswith(PASSED_TO_PIP_PREFIXES)}
    waiting = root / f".environ-{os.getpid()}-{time.monotonic_ns()}.json"
    _write_private(waiting, {"program": environ, "pip": passed, "pip_options": pip_options})
    listed = [arg for requirement in requirements for arg in ("--requirement", requirement)]
    words = [
        sys.executable, "-I", "-m", "worker.pyenv", "--root", str(root), "--keep", str(keep),
        "--environ", str(waiting), *listed, "--",
    ]  # fmt: skip
    return words, {"PATH": os.defpath, "LANG": "C.UTF-8"}


def launcher(environ: dict[str, str], requirements: list[str], settings: Any) -> Starting:
    """What runs first and execs an attempt's command, and the environment its process
    starts with: nothing and `environ`, or, with `requirements`, `prefix` and a bare one
    (`settings`: the worker's `Settings`)."""
    if not requirements:
        return [], environ
    return prefix(settings.var_dir, requirements, settings.pip_options, settings.envs_max, environ)


def _write_private(path: Path, said: dict[str, object]) -> None:
    """`said` as JSON at `path`, readable by this user alone, whole or not at all."""
    written = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    with open(os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        json.dump(said, out)
    written.replace(path)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    split = words.index("--")
    parser = argparse.ArgumentParser(prog="python -m worker.pyenv")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--keep", type=int, required=True)
    parser.add_argument("--environ", type=Path, required=True)
    parser.add_argument("--requirement", action="append", required=True)
    args = parser.parse_args(words[:split])
    command = words[split + 1 :]
    waiting = json.loads(args.environ.read_text())
    args.environ.unlink()
    environ, passed, pip_options = waiting["program"], waiting["pip"], waiting["pip_options"]
    try:
        held = ensure(args.requirement, args.root, pip_options, args.keep, passed)
    except NotInstalled as err:
        print(f"{SAID}{err}", file=sys.stderr, flush=True)
        said_to_bwrap(command, NOT_INSTALLED)
        return NOT_INSTALLED
    if not command:  # built ahead of a queued job (`worker.prepare`): nothing runs on it yet
        held.close()
        return 0
    os.set_inheritable(held.fileno(), True)  # held while the job runs: through the exec, to bwrap
    sys.stdout.flush()
    os.execve(command[0], command, environ)


def said_to_bwrap(command: list[str], code: int) -> None:
    """Where bwrap would have said how its command ended (`--json-status-fd`, read by the
    worker to tell a sandbox that failed to start from a job that failed): that it did."""
    if "--json-status-fd" in command:
        fd = int(command[command.index("--json-status-fd") + 1])
        with contextlib.suppress(OSError):
            os.write(fd, json.dumps({"exit-code": code}).encode() + b"\n")


def ensure(requirements: list[str], root: Path, pip_options: str, keep: int, passed: dict[str, str]) -> IO[str]:
    """Build the environment for `requirements` if it is not there yet (pip told `passed`
    of the worker's environment); `.ready`, held."""
    key = env_key(requirements, pip_options)
    folder = root / key
    with open(root / f"{key}.lock", "a") as lock:
        if not _locked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB):
            say("its Python environment is being built on this host (for a queued job, or another): waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / READY).is_file():
            say(f"its requirements are installed on this host already (environment {key[:12]})")
        else:
            build(folder, requirements, root, pip_options, pip_environment(root, passed))
        held = open(folder / READY)  # noqa: SIM115 - held until the attempt ends, through the exec
        fcntl.flock(held, fcntl.LOCK_SH)
    (folder / READY).touch()
    prune(root, keep, keep=key)
    return held


def build(folder: Path, requirements: list[str], root: Path, pip_options: str, environment: dict[str, str]) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # a build cut short
    started = time.monotonic()
    count = f"{len(requirements)} requirement{'s' if len(requirements) > 1 else ''}"
    say(f"installing {count} on this host, once: {' '.join(requirements)}")
    venv = [sys.executable, "-I", "-m", "venv", "--without-pip", str(folder)]
    subprocess.run(venv, check=True, capture_output=True, env=environment, stdin=subprocess.DEVNULL)
    purelib = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    lab = [path for path in site.getsitepackages() if Path(path).is_dir()]
    (purelib / "towerq-lab.pth").write_text("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in lab) + "\n")
    command = [
        sys.executable, "-I", "-m", "pip", "--python", str(folder / "bin" / "python"), "install", "--no-input",
        "--disable-pip-version-check", "--progress-bar", "off", "--only-binary", ":all:",
    ]  # fmt: skip
    words, urls = split_options(pip_options)
    last_error, shown, versions = "", 0, None
    with tempfile.TemporaryDirectory(prefix="pip-", dir=root) as empty:  # this user's alone (0700)
        if urls:  # pip reads them from a file of its own, not its command line
            options = Path(empty) / "options.txt"
            options.write_text("".join(f"{line}\n" for line in urls))
            words = [*words, "--requirement", str(options)]
        command += [*words, "--", *requirements]
        pip = subprocess.Popen(
            command,
            cwd=empty,
            env=environment,
            stdin=subprocess.DEVNULL,  # this process's own is the program's environment (`worker.sandbox_env`)
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=dies_with_this_process(),  # killed with its worker or job where no cgroup ends pip
        )
        assert pip.stdout is not None
        for line in pip.stdout:
            line = line.rstrip()
            if line.startswith(("ERROR:", "error:")):
                last_error = line[len("error:") :].strip()
                if found := FROM_VERSIONS.search(line):
                    versions = found.group(1)
            if line and shown < PIP_LINES_SHOWN:
                say(f"pip: {line}")
            shown += bool(line)
        code = pip.wait()
    if code != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise NotInstalled(reason(last_error, versions) if last_error else f"pip exited with code {code}")
    (folder / "requirements.txt").write_text("".join(f"{line}\n" for line in requirements))
    (folder / READY).write_text(json.dumps({"requirements": requirements, "built_s": time.monotonic() - started}))
    if shown > PIP_LINES_SHOWN:
        say(f"pip: ({shown - PIP_LINES_SHOWN} more lines)")
    say(f"installed in {time.monotonic() - started:.0f} s (environment {folder.name[:12]}, kept for the next job)")


FROM_VERSIONS = re.compile(r"\(from versions: (.*)\)$")
"""pip's word on the versions the index has of a requirement that none of them satisfies."""
VERSIONS_SHOWN = 8


def reason(last_error: str, versions: str | None) -> str:
    """pip's last error, and where it is that no version matched, which versions the index
    has (the newest `VERSIONS_SHOWN`): a member who mistyped one sees which to write."""
    if versions is None or not last_error.startswith("No matching distribution found"):
        return last_error
    if versions == "none":
        return f"{last_error} (the index has no version of it, or could not be reached)"
    listed = versions.split(", ")
    if len(listed) > VERSIONS_SHOWN:
        return f"{last_error} (the index has {len(listed)} versions: ..., {', '.join(listed[-VERSIONS_SHOWN:])})"
    return f"{last_error} (the index has {versions})"


URL_OPTIONS = ("--index-url", "-i", "--extra-index-url", "--find-links", "-f")
"""pip's options whose value is a URL (an index's, a folder's of wheels), which may carry a
password; pip reads each from a requirements file too."""
SHORT_URL_OPTIONS = tuple(option for option in URL_OPTIONS if not option.startswith("--"))


def split_options(pip_options: str) -> tuple[list[str], list[str]]:
    """`TOWERQ_PIP_OPTIONS` as pip's command-line words and the lines of a file it reads with
    `--requirement`: every option of URL_OPTIONS goes to the file (a URL may hold an index's
    password, and a command line is every local user's to read in /proc), the rest stays."""
    words, lines = [], []
    given = shlex.split(pip_options)
    i = 0
    while i < len(given):
        word = given[i]
        name, equals, value = word.partition("=")
        if name in URL_OPTIONS and name.startswith("--") and equals:  # --index-url=URL
            lines.append(f"{name} {value}")
        elif word in URL_OPTIONS and i + 1 < len(given):  # --index-url URL, -i URL
            lines.append(f"{word} {given[i + 1]}")
            i += 1
        elif word[:2] in SHORT_URL_OPTIONS and len(word) > 2:  # -iURL
            lines.append(f"{word[:2]} {word[2:]}")
        else:
            words.append(word)
        i += 1
    return words, lines


def pip_environment(root: Path, passed: dict[str, str]) -> dict[str, str]:
    """pip's environment: none of the job's, the worker's word on the network and pip."""
    return {"PATH": os.defpath, "LANG": "C.UTF-8", "PIP_CACHE_DIR": str(root / ".pip-cache"), **passed}


def prune(root: Path, keep_at_most: int, keep: str) -> list[str]:
    """Remove the least recently used environments past `keep_at_most`, but `keep` and those
    a job holds or that are being built; their keys. And what an attempt killed early left
    (its environment's file, its pip's folder), once older than `LEFT_BEHIND_S`."""
    for left in [*root.glob(".environ-*"), *root.glob("pip-*")]:
        with contextlib.suppress(OSError):
            if time.time() - left.lstat().st_mtime <= LEFT_BEHIND_S:
                continue
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left)
            else:
                left.unlink()
    others = sorted(
        (ready.parent for ready in root.glob(f"*/{READY}") if ready.parent.name != keep),
        key=lambda folder: (folder / READY).stat().st_mtime,
        reverse=True,
    )
    removed = []
    for folder in others[max(0, keep_at_most - 1) :]:
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


def say(text: str) -> None:
    print(text, flush=True)


def _locked(file: IO[str], how: int) -> bool:
    with contextlib.suppress(BlockingIOError):
        fcntl.flock(file, how)
        return True
    return False


if __name__ == "__main__":
    sys.exit(main())
