"""`towerq shell --gpus 1`: a shell on the lab's GPUs, in this terminal, as `srun --pty bash`.

A shell is a notebook session's terminal (docs/notebooks.md): the same walls, GPUs, folders
and idle rule, reached through the API's proxy over JupyterLab's terminal WebSocket (the
terminado protocol: `["stdin", text]` and `["set_size", rows, cols]` out, `["stdout", text]`
and `["disconnect", ...]` back). Without an id, it queues a session, waits for it, opens the
shell and, when the shell exits, ends the session (`--keep` leaves it running). With an id,
it opens a shell in that running session and leaves the session as it was.

It exits with the shell's exit status (the session's terminal says it, unseen, as it
ends), 1 when the connection was lost. On a terminal, this one is put in raw mode (every
key goes to the shell, Ctrl+C too) and its size follows the window. Piped, stdin is a
script the shell runs without prompts or echo, and its end ends the shell. What comes back
is drawn as the shell's terminal draws it, less its string commands (`plain.TerminalOutput`):
a program in the session cannot set this terminal's clipboard or title."""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
import re
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Iterator
from types import FrameType
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import ClientConnection, connect

from towerq.cli.notebook import add_session_options, last_message, notebook_spec, wait_open
from towerq.cli.plain import TerminalOutput
from towerq.cli.run import add_placement_options, dataset_reference
from towerq.cli.session import Api, ClientError, UsageError
from towerq.cli.transfer import upload_code
from towerq.client import FINAL_STATES
from towerq.errors import ApiError

RESIZE_POLL_S = 0.25
END_OF_INPUT = "\x04"
"""Ctrl+D: what a terminal sends the shell when piped input ends."""
END_OF_INPUT_EVERY_S = 1.0
FIRST_WORD_WAIT_S = 30.0
"""How long piped input waits for the shell's first word (its terminal's echo is off once it
speaks); a shell that never speaks gets the input then."""
LOST_CHECKS, LOST_CHECK_S = 10, 0.5
EXIT_SAID = re.compile(r"\]7777;towerq-exit=([0-9]{1,3})")
"""How the session's terminal says its shell's exit status (a string command, not drawn)."""
PLACEMENT = ("gpus", "gpu_ids", "host", "fraction", "name", "time_limit", "begin", "dataset", "group")
SESSION_OPTIONS = ("idle_timeout", "code", "env", "requirements")


class Hangup(ClientError):
    """The terminal went away (SIGHUP) or the command was told to stop (SIGTERM)."""


def add_shell_command(command: Any) -> None:
    shell: argparse.ArgumentParser = command(
        "shell", "a shell on the lab's GPUs in this terminal, ended with it: towerq shell --gpus 1"
    )
    shell.add_argument(
        "session", nargs="?", type=int, default=None, metavar="ID",
        help="a running notebook session to open a shell in (left running after); without it, a new "
        "session is queued for the shell and ended when it exits",
    )  # fmt: skip
    add_placement_options(shell)
    add_session_options(shell)
    shell.add_argument("--keep", action="store_true", help="leave the new session running when the shell exits")
    shell.set_defaults(run=run_shell)


def run_shell(args: argparse.Namespace) -> int:
    if args.session is not None:
        given = [f"--{name.replace('_', '-')}" for name in (*PLACEMENT, *SESSION_OPTIONS) if getattr(args, name)]
        if given or args.keep:
            raise UsageError(
                f"{', '.join(given) or '--keep'}: a running session keeps what it started with "
                f"(towerq shell without an id starts a new one with these)"
            )
        return shell_in(Api(args), args.session)
    notebook_spec(args)  # a bad --env or -r says so before a folder is packed or a byte sent
    api = Api(args)
    api.stdout_is_data = True  # stdout is the shell's; what towerq says goes to stderr
    args.dataset = dataset_reference(api, args.dataset)
    code = upload_code(api, args.code) if args.code is not None else None
    job = api.client.submit(notebook_spec(args, code))
    say(f"session {job.id} queued for the shell ({job.data['gpu_count']} GPU)")
    ended: dict[str, Any] | None = None
    opened = False
    try:
        if (ended := wait_open(api, job.id, say)) is not None:
            say(f"session {job.id} {ended['state']}: {ended.get('error') or 'it ended before the shell opened'}")
            return 1
        after = "it stays after the shell (--keep)" if args.keep else "exit ends it"
        say(f"session {job.id} is ready on {place_of(api, job.id)}: {after}")
        opened = True
        return attach(api, job.id)
    finally:
        if ended is not None:
            pass  # nothing left to end
        elif opened and args.keep:
            say(f"session {job.id} stays: towerq shell {job.id} opens another shell, towerq cancel {job.id} ends it")
        else:  # the shell exited or was lost, or Ctrl+C while it waited: as srun's, the session ends
            end_session(api, job.id)


def shell_in(api: Api, job_id: int) -> int:
    """A shell in running session `job_id` (the caller's, or any as an admin)."""
    api.stdout_is_data = True
    job = api.client.request("GET", f"/api/jobs/{job_id}")
    if (job.get("spec") or {}).get("kind") != "notebook":
        raise ClientError(
            f"job {job_id} is not a notebook session: a shell opens in a session "
            f"(towerq shell --gpus 1 starts one for it)"
        )
    if job["state"] in FINAL_STATES:
        raise ClientError(f"session {job_id} {job['state']}: towerq shell --gpus 1 starts a new one")
    if (final := wait_open(api, job_id, say)) is not None:
        raise ClientError(f"session {job_id} {final['state']}: {final.get('error') or 'it ended'}")
    return attach(api, job_id)


def say(text: object) -> None:
    print(text, file=sys.stderr, flush=True)


def place_of(api: Api, job_id: int) -> str:
    """Where a running session is: `lab-a GPU 3`, `lab-a GPUs 0,1`."""
    allocation = api.client.request("GET", f"/api/jobs/{job_id}").get("allocation") or {}
    gpus = [str(gpu) for gpu in allocation.get("gpus") or []]
    return f"{allocation.get('host', '?')} GPU{'s' if len(gpus) > 1 else ''} {','.join(gpus)}"


def end_session(api: Api, job_id: int) -> None:
    """End the session the shell started, as JupyterLab's Shut Down does (it ends
    `succeeded`); one still queued or starting is cancelled. An error is said, not raised."""
    try:
        try:
            api.client.shut_down(job_id)
        except ApiError:
            api.client.cancel(job_id)
        say(f"session {job_id} ended")
    except (ApiError, OSError) as err:
        say(f"could not end session {job_id} ({err}): towerq cancel {job_id} ends it")


def attach(api: Api, job_id: int) -> int:
    """Open a terminal in the session, relay this one to it until its shell exits (0), or the
    connection is lost (1)."""
    client = api.client
    name = client.open_terminal(job_id, piped=not os.isatty(sys.stdin.fileno()))
    url = client.socket_url(f"/sessions/{job_id}/terminals/websocket/{name}")
    try:
        with connect(url, additional_headers={"Authorization": f"Bearer {client.config.token}"}, open_timeout=30) as ws:
            return relay(api, ws, job_id)
    except (InvalidHandshake, OSError) as err:
        raise ClientError(f"could not open a shell in session {job_id}: {err}") from err
    finally:
        with contextlib.suppress(ApiError, OSError):  # a shell left behind (connection lost) ends
            client.close_terminal(job_id, name)


def relay(api: Api, ws: ClientConnection, job_id: int) -> int:
    """This terminal's keys to the shell, the shell's output to this terminal."""
    stdin, stdout = sys.stdin.fileno(), sys.__stdout__.fileno() if sys.__stdout__ else 1
    on_terminal = os.isatty(stdin)
    resized = threading.Event()
    resized.set()
    output = TerminalOutput()
    with raw_terminal(stdin if on_terminal else None), signals_end(resized):
        spoke = threading.Event()
        threading.Thread(target=send_input, args=(ws, stdin, on_terminal, spoke), daemon=True).start()
        while True:
            if resized.is_set() and os.isatty(stdout):
                resized.clear()
                size = os.get_terminal_size(stdout)
                ws.send(json.dumps(["set_size", size.lines, size.columns]))
            try:
                message = json.loads(ws.recv(timeout=RESIZE_POLL_S))
            except TimeoutError:
                continue
            except ConnectionClosed:
                lost(api, job_id, on_terminal)
                return 1
            if message[0] == "stdout":
                spoke.set()
                write_all(stdout, output.feed(str(message[1])).encode("utf-8", "replace"))
            elif message[0] == "disconnect":
                return exit_status(output.strings)


def exit_status(strings: list[str]) -> int:
    """The shell's exit status, as the session's terminal says it last (`worker.notebook`'s
    TERMINAL_SHELL); 0 where it did not (a session started before it said so)."""
    said = [EXIT_SAID.fullmatch(text) for text in strings]
    found = [int(match.group(1)) for match in said if match]
    return min(found[-1], 255) if found else 0


def send_input(ws: ClientConnection, stdin: int, on_terminal: bool, spoke: threading.Event) -> None:
    """Every byte read from stdin, as text, to the shell. Piped, once the shell has said it
    reads (`worker.notebook`'s PIPED_SHELL: its terminal's echo is off by then); at the end
    of the input, Ctrl+D, its end, and again each second until the shell has ended (a program
    of the script may read the terminal itself, and a session older than the piped shell
    needs one for each program that reads stdin and one for its prompt)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    with contextlib.suppress(ConnectionClosed, OSError):
        if not on_terminal:
            spoke.wait(FIRST_WORD_WAIT_S)
        while chunk := os.read(stdin, 4096):
            if text := decoder.decode(chunk):
                ws.send(json.dumps(["stdin", text]))
        if on_terminal:
            return
        if rest := decoder.decode(b"", final=True):
            ws.send(json.dumps(["stdin", rest]))
        while True:
            ws.send(json.dumps(["stdin", END_OF_INPUT]))
            time.sleep(END_OF_INPUT_EVERY_S)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def lost(api: Api, job_id: int, on_terminal: bool) -> None:
    """Say why the shell went away without exiting: the session ended, or the connection."""
    why = "the connection to the API closed"
    with contextlib.suppress(ApiError, OSError):
        for _ in range(LOST_CHECKS):  # a session being stopped takes its worker a moment to say so
            job = api.client.request("GET", f"/api/jobs/{job_id}")
            if job["state"] in FINAL_STATES:
                why = f"the session {job['state']}: {job.get('error') or last_message(job) or 'it ended'}"
                break
            time.sleep(LOST_CHECK_S)
    say(f"{chr(13) + chr(10) if on_terminal else ''}shell of session {job_id} lost: {why}")


@contextlib.contextmanager
def raw_terminal(fd: int | None) -> Iterator[None]:
    """Every key to the shell as typed (Ctrl+C, arrows, tab) while the shell is open; the
    terminal as it was after, however this ends."""
    if fd is None:
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def signals_end(resized: threading.Event) -> Iterator[None]:
    """SIGWINCH: the window's new size goes to the shell. SIGHUP and SIGTERM: end here, and
    let the cleanup run (the terminal restored, the shell and a new session ended)."""

    def resize(signum: int, frame: FrameType | None) -> None:
        resized.set()

    def hang_up(signum: int, frame: FrameType | None) -> None:
        raise Hangup(signal.Signals(signum).name)

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGWINCH, signal.SIGHUP, signal.SIGTERM)}
    signal.signal(signal.SIGWINCH, resize)
    signal.signal(signal.SIGHUP, hang_up)
    signal.signal(signal.SIGTERM, hang_up)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
