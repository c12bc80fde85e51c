"""Processes as Linux shows them: liveness, groups and sessions from `/proc`, and killing a
whole process group until it is gone.

The one home for this: the runner (a trainer's group), the agent (a trainer left over by a
dead worker), the inventory (which trainers still hold a simulated GPU), `towerq up` and
the tests (nothing left behind) all ask here.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from service.core import defaults
from worker.lines import LineReader

KILL_CHECK_INTERVAL_S = 0.1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessInfo:
    """One process, as `/proc/<pid>/stat` and `cmdline` describe it."""

    pid: int
    state: str
    """R, S, D, Z (zombie), T (stopped), ..."""
    ppid: int
    pgid: int
    sid: int
    cmdline: str
    cpu_s: float
    """User plus system CPU time so far."""


def read_process(pid: int) -> ProcessInfo | None:
    """The process `pid`, or None when it is gone (or was never there)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # The command name in parentheses may hold spaces: split after its last ')'.
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as raw:
            cmdline = raw.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        return None
    cpu_s = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return ProcessInfo(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]), cmdline, cpu_s)


def all_processes() -> Iterator[ProcessInfo]:
    """Every process this one can see, zombies included."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := read_process(int(entry))) is not None:
            yield info


def _reaches(send: Callable[[int, int], None], target: int) -> bool:
    """Whether signal 0 reaches `target` (a pid with os.kill, a group with os.killpg)."""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but not ours
        return True
    return True


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    if not _reaches(os.kill, pid):
        return False
    info = read_process(pid)
    return info is None or info.state != "Z"


def live_members(*, pgid: int | None = None, sid: int | None = None) -> list[ProcessInfo]:
    """The live (non-zombie) processes of a process group or of a session."""
    return [
        p
        for p in all_processes()
        if p.state != "Z" and (pgid is None or p.pgid == pgid) and (sid is None or p.sid == sid)
    ]


def group_alive(pgid: int) -> bool:
    return _reaches(os.killpg, pgid) and bool(live_members(pgid=pgid))


def signal_program(leader: int, signum: int, sandboxed: bool) -> int:
    """`signum` to a program's own first process only, not to its children (a data loader's
    workers would die of a signal they do not handle), as Slurm's `--signal=B:`. Unsandboxed
    that is the group's leader; in the sandbox, the processes bwrap's init started (bwrap,
    the leader, forks its init, which forks the command). How many got it: 0 before the
    program started."""
    if not sandboxed:
        if not pid_alive(leader):
            return 0
        signal_process(leader, signum)
        return 1
    members = live_members(pgid=leader)
    inits = {p.pid for p in members if p.ppid == leader}
    firsts = [p.pid for p in members if p.ppid in inits]
    for pid in firsts:
        signal_process(pid, signum)
    return len(firsts)


def signal_group(pgid: int, signum: int) -> None:
    """Send `signum` to every process of the group; a group already gone is fine."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def signal_process(pid: int, signum: int) -> None:
    """Send `signum` to one process; one already gone is fine."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def kill_group(pgid: int, timeout: float = 30.0) -> bool:
    """SIGKILL the group until none of it is left alive; False if some lived past `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        signal_group(pgid, signal.SIGKILL)
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(KILL_CHECK_INTERVAL_S)


def kill_pids(pids: set[int], timeout: float = 30.0) -> bool:
    """SIGKILL these processes until none of them is alive; False if some lived past
    `timeout`. For a sandboxed trainer's processes, which die with bwrap's pid namespace
    a moment after bwrap itself (its init inside is killed by `--die-with-parent`)."""
    deadline = time.monotonic() + timeout
    while left := [p for p in pids if pid_alive(p)]:
        if time.monotonic() >= deadline:
            return False
        for pid in left:
            signal_process(pid, signal.SIGKILL)
        time.sleep(KILL_CHECK_INTERVAL_S)
    return True


def output_lines(
    process: subprocess.Popen[bytes],
    tick_s: float,
    max_line: int = defaults.TRAINER_LINE_BYTES,
    redraw_every_s: float = defaults.REDRAWN_LINE_EVERY_S,
) -> Iterator[tuple[str, bytes] | None]:
    """The lines of a process's stdout and stderr as they come, as ("out" | "err", line),
    unbuffered; None after every wait of at most `tick_s`, so the caller can do its
    periodic work. Ends when both pipes are closed (a last line without a newline too).
    A line redrawn with carriage returns (a progress bar) comes as it ended, and while it is
    redrawn as it stands at most every `redraw_every_s`; a line longer than `max_line`
    bytes comes cut to that length (`worker.lines`)."""
    assert process.stdout is not None and process.stderr is not None
    readers = {"out": LineReader(max_line, redraw_every_s), "err": LineReader(max_line, redraw_every_s)}
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, "out")
        selector.register(process.stderr, selectors.EVENT_READ, "err")
        while selector.get_map():
            for key, _ in selector.select(timeout=tick_s):
                stream = key.data
                chunk = os.read(key.fd, 65536)
                if chunk:
                    lines = readers[stream].feed(chunk, time.monotonic())
                else:
                    selector.unregister(key.fileobj)
                    lines = readers[stream].close()
                for line in lines:
                    yield stream, line
            for stream, reader in readers.items():
                for line in reader.tick(time.monotonic()):
                    yield stream, line
            yield None


def descendants(pid: int) -> set[int]:
    """The live processes below `pid` (children, theirs, ...), by the host's pids: how the
    worker finds a sandboxed trainer's processes without asking the trainer."""
    children: dict[int, list[int]] = {}
    for info in all_processes():
        if info.state != "Z":
            children.setdefault(info.ppid, []).append(info.pid)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def marked(name: str, value: str) -> list[ProcessInfo]:
    """The live processes started with `name=value` (or `name=value-<more>`, a part of that
    run: a test runner's worker) in their environment: a marker every descendant of a
    process that set it inherits, wherever it was reparented to."""
    exact = f"{name}={value}".encode()
    part = exact + b"-"
    found = []
    for process in all_processes():
        try:
            with open(f"/proc/{process.pid}/environ", "rb") as raw:
                environment = raw.read().split(b"\0")
        except OSError:
            continue
        if process.state != "Z" and any(e == exact or e.startswith(part) for e in environment):
            found.append(process)
    return found


def is_trainer(pid: int) -> bool:
    """True when `pid` is a `python -m worker.trainer` process."""
    info = read_process(pid)
    return info is not None and "worker.trainer" in info.cmdline


def trainer_pids() -> set[int]:
    """Every live trainer process on this machine."""
    return {p.pid for p in all_processes() if p.state != "Z" and "worker.trainer" in p.cmdline}


def signal_trainer(leader: int, signum: int, sandboxed: bool) -> None:
    """`signum` to a trainer's process group (`leader` is its first process). In the
    sandbox a stop request spares bwrap, the group's leader: bwrap dies of SIGTERM and takes
    the trainer with it before it could checkpoint. (Only bwrap alive: the trainer has not
    started; it goes too.)"""
    if sandboxed and signum != signal.SIGKILL:
        inside = [p.pid for p in live_members(pgid=leader) if p.pid != leader]
        if inside:
            for pid in inside:
                signal_process(pid, signum)
            return
    signal_group(leader, signum)
