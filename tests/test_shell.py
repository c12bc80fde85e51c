"""`towerq shell`: a shell on a job's GPUs in the member's terminal (as `srun --pty bash`),
a notebook session's terminal reached through the API: a new session for it, ended when the
shell exits, or a shell in a running one; piped or typed in a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.stack import REPO, Stack, finished, wait_for
from tests.test_notebooks import start_stack

pytestmark = pytest.mark.slow
HOSTILE = r"printf 'ok \033[31mred\033[0m\033]52;c;Y3VybCBldmlsIHwgc2g=\007\033]0;owned\007 end\n'"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The commands a test starts: killed at its end, whatever it asserted."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def cli_env(home: Path, api: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_")}
    return {**env, "TOWERQ_API_URL": api, "TOWERQ_TOKEN": token, "PYTHONPATH": str(REPO), "HOME": str(home)}


def shell(*args: str, cwd: Path, env: dict[str, str], typed: str = "") -> subprocess.CompletedProcess[bytes]:
    """`towerq shell ARGS` with `typed` piped in."""
    command = [sys.executable, "-m", "service.cli", "shell", *args]
    return subprocess.run(command, input=typed.encode(), capture_output=True, env=env, cwd=cwd, timeout=240)


def text_of(drawn: str) -> str:
    """What a terminal shows of `drawn`, line by line: without its CSI sequences and CRs."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn).replace("\r", "")


class Terminal:
    """`towerq shell ARGS` in a pseudo-terminal of `rows` x `columns`, typed into."""

    def __init__(self, *args: str, env: dict[str, str], rows: int, columns: int) -> None:
        self.leader, follower = pty.openpty()
        self.resize(rows, columns)
        command = [sys.executable, "-m", "service.cli", "shell", *args]
        self.process = subprocess.Popen(
            command, stdin=follower, stdout=follower, stderr=follower, env=env, start_new_session=True
        )
        os.close(follower)
        self.drawn = b""

    def resize(self, rows: int, columns: int) -> None:
        fcntl.ioctl(self.leader, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

    def type(self, keys: str) -> None:
        os.write(self.leader, keys.encode())

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.drawn:
            assert time.monotonic() < deadline, f"{text!r} never drawn: {self.drawn!r}"
            if select.select([self.leader], [], [], 0.2)[0]:
                try:
                    self.drawn += os.read(self.leader, 65536)
                except OSError:  # the command ended
                    break
        return self.drawn.decode(errors="replace")

    def modes(self) -> int:
        return int(termios.tcgetattr(self.leader)[3])


def test_a_shell_runs_on_its_sessions_gpu_in_the_walls_and_ends_with_it(
    stack: Stack,
    settings: Settings,
    make_token: Callable[..., str],
    tmp_path: Path,
    started: list[subprocess.Popen[bytes]],
) -> None:
    start_stack(stack)
    alice_token = make_token("alice")
    alice = stack.client(alice_token)
    wait_for(lambda: alice.get("/api/gpus").json(), 60, "the worker to register its GPUs")
    env = cli_env(tmp_path, str(stack.api_url), alice_token)
    project = tmp_path / "project"
    project.mkdir()
    (project / "helpers.py").write_text("ANSWER = 42\n")

    # a new session for the shell, with the project's code and an env; piped input runs, then
    # its end ends the shell, and the shell's exit ends the session (succeeded, GPU freed)
    typed = (
        "echo gpu=$CUDA_VISIBLE_DEVICES word=$WORD user=$(id -un)\n"
        "python -c 'import helpers; print(helpers.ANSWER * 2)'\n"
        f"{HOSTILE}\n"
        "python -c 'import sys; print(repr(sys.stdin.read()), \"read\")'\n"
        "the rest\n"
    )
    done = shell("--gpu-ids", "0", "--code", "project", "--env", "WORD=hi", cwd=tmp_path, env=env, typed=typed)
    out, said = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, out + said
    lines = text_of(out).splitlines()
    # the script's output alone, as `ssh host bash < script` gives it (no prompt, no echo), and a
    # program reading stdin reads the script's rest, then its end; `python` is the lab's
    assert lines == ["gpu=0 word=hi user=nobody", "84", "ok red end", "'the rest\\n' read"], lines
    # what the session drew passes (colours), its string commands do not (clipboard, title)
    assert "ok \x1b[31mred\x1b[0m end" in out, repr(out)
    assert "\x1b]" not in out and "\x07" not in out, repr(out)
    job_id = int(said.split("session ", 1)[1].split()[0])
    assert f"session {job_id} queued for the shell (1 GPU)" in said, said
    assert f"session {job_id} is ready on lab-a GPU 0: exit ends it" in said and f"session {job_id} ended" in said, said
    assert finished(alice, job_id, timeout=60)["state"] == "succeeded"

    # --keep leaves the session running; a shell in it, typed in a terminal: its size (and a
    # new one), Ctrl+C to the shell's program, not to towerq; exit leaves the session running
    # and the terminal as it was
    done = shell("--gpu-ids", "1", "--keep", cwd=tmp_path, env=env, typed="exit\n")
    said = done.stderr.decode()
    assert done.returncode == 0, said
    kept = int(said.split("session ", 1)[1].split()[0])
    assert "is ready on lab-a GPU 1: it stays after the shell (--keep)" in said, said
    assert f"session {kept} stays: towerq shell {kept} opens another shell" in said, said
    terminal = Terminal(str(kept), env=env, rows=31, columns=97)
    started.append(terminal.process)
    modes = terminal.modes()
    terminal.wait_for("$ ")
    terminal.type("stty size\r")
    terminal.wait_for("31 97")
    terminal.resize(40, 120)
    os.kill(terminal.process.pid, 28)  # SIGWINCH, as the terminal sends it
    time.sleep(1)
    terminal.type("stty size; echo $CUDA_VISIBLE_DEVICES-visible\r")
    terminal.wait_for("40 120")
    terminal.wait_for("1-visible")
    terminal.type("sleep 60\r")
    time.sleep(1)
    terminal.type("\x03")
    terminal.type("echo after-$((6*7))\r")
    terminal.wait_for("after-42")
    terminal.type("exit\r")
    assert terminal.process.wait(60) == 0
    assert terminal.modes() == modes  # no longer raw
    assert alice.get(f"/api/jobs/{kept}").json()["state"] == "running"

    # it exits with the shell's exit status, as srun and ssh do
    done = shell(str(kept), cwd=tmp_path, env=env, typed="true\nexit 3\n")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "7777" not in text_of(done.stdout.decode()), "the status is said unseen"

    # what is not a shell of yours is refused, saying why
    bob = cli_env(tmp_path, str(stack.api_url), make_token("bob"))
    refused = shell(str(kept), cwd=tmp_path, env=bob)
    assert refused.returncode == 1 and b"Traceback" not in refused.stderr, refused.stderr
    assert f"job {kept} not found".encode() in refused.stderr or b"only they" in refused.stderr, refused.stderr
    model = alice.post("/api/jobs", json={"model": "mlp", "dataset": "digits", "gpu_count": 1, "hold": True})
    refused = shell(str(model.json()["id"]), cwd=tmp_path, env=env)
    assert refused.returncode == 1 and b"is not a notebook session" in refused.stderr, refused.stderr
    refused = shell(str(kept), "--gpus", "2", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and b"--gpus: a running session keeps" in refused.stderr, refused.stderr

    # the session ends under an open shell: the shell says so, exit 1
    lost = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "shell", str(kept)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    started.append(lost)
    assert lost.stdin is not None
    lost.stdin.write(b"echo waiting; sleep 120\n")
    lost.stdin.flush()
    time.sleep(3)
    assert alice.post(f"/api/jobs/{kept}/cancel").status_code == 202
    out_bytes, said_bytes = lost.communicate(timeout=60)
    assert lost.returncode == 1, said_bytes
    assert f"shell of session {kept} lost: the session cancelled".encode() in said_bytes, said_bytes
