"""The mounts this process sees, read from /proc/self/mountinfo (proc(5)): the cgroup
hierarchies (`worker.cgroups`), the filesystem that holds a folder (`worker.disk`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPED = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: Path
    root: str
    """The path inside its filesystem that is mounted there."""
    kind: str
    """The filesystem's type (`ext4`, `nfs4`, `cgroup2`, `fuse.sshfs`...)."""
    options: frozenset[str]
    """The filesystem's own options (the super options)."""


def mounts(table: Path = MOUNTINFO) -> list[Mount]:
    """Every mount of `table`, in its order (a later one over the same point covers an
    earlier); none where it cannot be read."""
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) >= 5 and len(tail) >= 3:
            options = frozenset(tail[2].split(","))
            found.append(Mount(Path(_unescape(fields[4])), _unescape(fields[3]), tail[0], options))
    return found


def holding(path: Path, table: Path = MOUNTINFO) -> Mount | None:
    """The mount that holds `path` (the deepest mount point on its way; the last of those)."""
    path = path.resolve()
    best: Mount | None = None
    for mount in mounts(table):
        if (mount.point == path or mount.point in path.parents) and (
            best is None or len(mount.point.parts) >= len(best.point.parts)
        ):
            best = mount
    return best


def beneath(folder: Path, table: Path = MOUNTINFO) -> list[Path]:
    """The mount points inside `folder` (not `folder` itself), deepest first, each once: the
    order they can be unmounted in."""
    folder = folder.resolve()
    points = {mount.point for mount in mounts(table) if folder in mount.point.parents}
    return sorted(points, key=lambda point: len(point.parts), reverse=True)


def _unescape(field: str) -> str:
    """A path as the kernel writes it there: a space as `\\040`, a tab `\\011`, `\\` `\\134`."""
    return _ESCAPED.sub(lambda octal: chr(int(octal.group(1), 8)), field)
