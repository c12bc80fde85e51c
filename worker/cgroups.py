"""A cgroup per trainer attempt: what holds all of an attempt's processes (none can leave
it, `setsid()` and double forks included), kills them together, bounds their memory and
process count, and weighs their share of the host's CPUs by the GPUs they hold.

The worker makes the group beside itself, in every hierarchy it may write: the unified
(v2) one, and on a host that still mounts v1 controllers (`memory`, `pids`, `cpu`) those
too, each under the worker's own cgroup there (`<its cgroup>/towerq-<host>-job-<id>-<attempt>`).
The trainer joins them before it runs anything (`preexec_fn`), so nothing it starts is
outside. The limits go where a controller is available: `memory.max` /
`memory.limit_in_bytes`, `pids.max`, and the CPU weight, `cpu.shares` / `cpu.weight`: a
share, not a cap (an idle CPU is anyone's), so that when the CPUs are contended an attempt
gets them in proportion to its GPUs: a 1-GPU job's 64 data-loading processes do not starve
a 4-GPU neighbour's input pipeline. Where no hierarchy is writable (an unprivileged
worker without a delegated cgroup) the attempt has none: the sandbox's pid namespace still
ends whatever the trainer leaves, and the job's log names the limits that are not enforced.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from worker.mountinfo import mounts

log = logging.getLogger(__name__)

V1_CONTROLLERS = ("memory", "pids", "cpu")
_FIELD = {"memory": "memory_mb", "processes": "processes", "cpu": "cpu_shares"}
DEFAULT_SHARES = 1024
"""v1's `cpu.shares` of a group, and the kernel's weight of a process at nice 0: the scale
of `Limits.cpu_shares`. v2's `cpu.weight` is the same on a scale of 100."""
KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class Limits:
    """What one attempt may use; None: no limit."""

    memory_mb: int | None
    processes: int | None
    cpu_shares: int | None = None
    """The attempt's CPU weight on v1's scale (`DEFAULT_SHARES`: a process at nice 0)."""


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: where the worker's own cgroup sits in it."""

    controller: str
    """"" for the unified (v2) hierarchy, else the v1 controller."""
    own: Path


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: "" for v2, else each v1 controller."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def hierarchies() -> list[Hierarchy]:
    """The hierarchies where this worker may make cgroups: v2 and the v1 controllers it
    uses, each at the worker's own cgroup, when that folder is writable."""
    own = _own_paths()
    found: list[Hierarchy] = []
    for mount in mounts():
        if mount.kind not in ("cgroup", "cgroup2"):
            continue
        controllers = [""] if mount.kind == "cgroup2" else [c for c in V1_CONTROLLERS if c in mount.options]
        for controller in controllers:
            path = own.get(controller)
            if path is None or not path.startswith(mount.root):
                continue
            folder = mount.point / path[len(mount.root) :].lstrip("/")
            if folder.is_dir() and os.access(folder, os.W_OK) and all(h.controller != controller for h in found):
                found.append(Hierarchy(controller, folder))
    return found


@dataclass
class AttemptGroup:
    """The cgroups of one attempt (one folder per hierarchy) and the limits set there."""

    folders: dict[str, Path] = field(default_factory=dict)
    enforced: dict[str, str] = field(default_factory=dict)
    """Limit name -> how it is enforced (for the job's log)."""

    @classmethod
    def create(cls, name: str, limits: Limits) -> AttemptGroup:
        group = cls()
        for hierarchy in hierarchies():
            folder = hierarchy.own / name
            try:
                folder.mkdir(exist_ok=True)
            except OSError as err:
                log.warning("cannot make cgroup %s: %s", folder, err)
                continue
            group.folders[hierarchy.controller] = folder
        group._limit(limits)
        return group

    def _limit(self, limits: Limits) -> None:
        v2 = self.folders.get("")
        if v2 is not None:
            _enable_v2_controllers(v2.parent)
        if limits.memory_mb is not None:
            value = limits.memory_mb * 2**20
            places = [(v2, "memory.max", value), (self.folders.get("memory"), "memory.limit_in_bytes", value)]
            self._write_limit("memory", limits.memory_mb, places)
        if limits.processes is not None:
            count = limits.processes
            self._write_limit(
                "processes", count, [(v2, "pids.max", count), (self.folders.get("pids"), "pids.max", count)]
            )
        if limits.cpu_shares is not None:
            shares = min(262_144, max(2, limits.cpu_shares))
            weight = min(10_000, max(1, round(shares * 100 / DEFAULT_SHARES)))
            places = [(v2, "cpu.weight", weight), (self.folders.get("cpu"), "cpu.shares", shares)]
            self._write_limit("cpu", shares, places)

    def _write_limit(self, name: str, shown: int, places: list[tuple[Path | None, str, int]]) -> None:
        for folder, file, value in places:
            if folder is None or not (folder / file).exists():
                continue
            try:
                (folder / file).write_text(str(value))
            except OSError as err:
                log.warning("cannot set %s in %s: %s", file, folder, err)
                continue
            self.enforced[name] = f"{shown} ({folder.parent.name}/{folder.name}/{file})"
            return

    @property
    def exists(self) -> bool:
        return bool(self.folders)

    def join(self) -> None:
        """Put the calling process into every folder: the trainer's `preexec_fn`, so it
        runs nothing outside them. Only writes (safe between fork and exec)."""
        pid = str(os.getpid()).encode()
        for folder in self.folders.values():
            fd = os.open(folder / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def adopt(self, pids: set[int]) -> None:
        """Move these running processes into the groups (a warm trainer taking its job)."""
        for folder in self.folders.values():
            for pid in pids:
                try:
                    (folder / "cgroup.procs").write_text(str(pid))
                except OSError as err:
                    log.warning("cannot move pid %s into %s: %s", pid, folder, err)

    def describe(self, limits: Limits) -> str:
        """The attempt's limits as its log shows them."""
        if not self.exists:
            return (
                "no cgroup could be made here (the worker may not write one): this attempt's memory and "
                "processes are not limited, and what it leaves behind dies with its sandbox"
            )
        wanted = {
            "memory": f"memory {limits.memory_mb} MB",
            "processes": f"{limits.processes} processes and threads",
            "cpu": f"CPU weight {limits.cpu_shares} (by its GPUs; a process's 1024), where cores are contended",
        }
        shown = [text for name, text in wanted.items() if name in self.enforced]
        missing = [text for name, text in wanted.items() if name not in self.enforced and getattr(limits, _FIELD[name])]
        said = "limits: " + (", ".join(shown) or "none")
        return said + (f" (not enforced here: {', '.join(missing)})" if missing else "")

    def pids(self) -> set[int]:
        """Every process in the attempt's groups, by the host's pids."""
        found: set[int] = set()
        for folder in self.folders.values():
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                continue
        return found

    def kill(self) -> bool:
        """SIGKILL every process of the attempt and wait until none is left; False when
        some outlived KILL_WAIT_S."""
        deadline = time.monotonic() + KILL_WAIT_S
        while pids := self.pids():
            v2 = self.folders.get("")
            if v2 is not None and (v2 / "cgroup.kill").exists():
                try:
                    (v2 / "cgroup.kill").write_text("1")
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def limits_hit(self) -> list[str]:
        """The limits the kernel enforced on this attempt (an OOM kill, a refused fork)."""
        hit = []
        if self._count("memory", "memory.events", "oom_kill") or self._v1_oom_kills():
            hit.append(f"memory limit of {self.enforced['memory'].split()[0]} MB")
        if self._count("processes", "pids.events", "max"):
            hit.append(f"process limit of {self.enforced['processes'].split()[0]}")
        return hit

    def _count(self, limit: str, file: str, key: str) -> int:
        if limit not in self.enforced:
            return 0
        total = 0
        for folder in self.folders.values():
            try:
                for line in (folder / file).read_text().splitlines():
                    name, _, value = line.partition(" ")
                    total += int(value) if name == key else 0
            except (OSError, ValueError):
                continue
        return total

    def _v1_oom_kills(self) -> int:
        folder = self.folders.get("memory")
        if folder is None or "memory" not in self.enforced:
            return 0
        try:
            for line in (folder / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Remove the (emptied) folders."""
        for folder in self.folders.values():
            try:
                folder.rmdir()
            except OSError as err:
                log.warning("cannot remove cgroup %s: %s", folder, err)
        self.folders.clear()


def _enable_v2_controllers(parent: Path) -> None:
    """Let children of `parent` use memory, pids and cpu, where the kernel offers them there.
    Refused (EBUSY) when `parent` holds processes itself and is not the root: then the v2
    group only holds and kills, and the limits come from v1 where mounted. One at a time: a
    kernel may refuse one alone (cpu, while a realtime process runs in a child group)."""
    try:
        offered = (parent / "cgroup.controllers").read_text().split()
    except OSError as err:
        log.debug("cannot read the cgroup controllers of %s: %s", parent, err)
        return
    for controller in ("memory", "pids", "cpu"):
        if controller in offered:
            try:
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            except OSError as err:
                log.debug("cannot enable the %s controller in %s: %s", controller, parent, err)


def remove_stale(prefix: str = "towerq-") -> int:
    """End the attempt groups of workers that are gone (a worker killed with SIGKILL leaves
    its groups, and maybe processes its trainers left, behind): what is still in them is
    killed, then they are removed. Returns how many groups were ended."""
    stale: dict[str, AttemptGroup] = {}
    for hierarchy in hierarchies():
        for folder in hierarchy.own.glob(f"{prefix}*-job-*"):
            owner = folder.name[len(prefix) :].split("-", 1)[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                stale.setdefault(folder.name, AttemptGroup()).folders[hierarchy.controller] = folder
    for name, group in stale.items():
        if not group.kill():
            log.error("processes of the stale cgroup %s outlived SIGKILL", name)
        group.remove()
    return len(stale)
