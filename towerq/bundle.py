"""A folder's code as a bundle: what `towerq run`, `towerq submit --code FOLDER` and
`Client.send_code` send. The folder's files, leaving out what `.gitignore` and
`.towerqignore` name (`name`, `*.ext`, `folder/`, `/anchored`, `a/b`, `!negation`; the last
matching line wins), version control folders, virtual environments, caches and links; a
folder over the bundle limit is refused before a byte is sent, naming its biggest files.
Its id is the API's for the same files (`towerq.contract.paths.bundle_id`), so a folder the
API already holds is not sent again."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from towerq.contract.paths import bundle_id
from towerq.errors import TowerqError

ALWAYS_LEFT_OUT = (".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                   ".ipynb_checkpoints", "node_modules", ".tox", ".nox", ".venv", "venv")  # fmt: skip
IGNORE_FILES = (".gitignore", ".towerqignore")
BUNDLE_LIMIT_BYTES = 20_000_000
"""The API's default `TOWERQ_MAX_CODE_BYTES`: a larger folder is refused here, before it is
sent, naming its biggest files (the API refuses it too, past its own setting)."""


@dataclass
class Ignore:
    """The patterns of `.gitignore` files (and `.towerqignore`): `name`, `*.ext`, `dir/`,
    `/anchored`, `a/b`, `**`, and `!negation`; the last matching line wins, as in git."""

    rules: list[tuple[Path, str, bool, bool]] = field(default_factory=list)
    """(the folder of the file that said it, the pattern, negated, folders only)"""

    def read(self, folder: Path) -> None:
        for name in IGNORE_FILES:
            path = folder / name
            if not path.is_file():
                continue
            for raw in path.read_text(errors="replace").splitlines():
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                negated = line.startswith("!")
                line = line.removeprefix("!")
                only_folders = line.endswith("/")
                self.rules.append((folder, line.rstrip("/"), negated, only_folders))

    def ignored(self, path: Path, is_folder: bool) -> bool:
        verdict = False
        for base, pattern, negated, only_folders in self.rules:
            if only_folders and not is_folder:
                continue
            try:
                relative = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if _matches(relative, pattern):
                verdict = not negated
        return verdict


def _matches(relative: str, pattern: str) -> bool:
    if pattern.startswith("/") or "/" in pattern.rstrip("/"):
        pattern = pattern.removeprefix("/").replace("**/", "*")
        return fnmatch.fnmatchcase(relative, pattern)
    return fnmatch.fnmatchcase(relative.rsplit("/", 1)[-1], pattern)


@dataclass
class Packed:
    data: bytes
    entries: list[dict[str, Any]]
    left_out: list[str]

    @property
    def size(self) -> int:
        return sum(int(e["size"]) for e in self.entries)

    @property
    def id(self) -> str:
        return bundle_id(self.entries)


def pack(folder: Path) -> Packed:
    """The folder's files as a .tar.gz, with each file's path, size and SHA-256 (what the API
    makes the bundle's id of), and what was left out by an ignore file or as a link (version
    control, environments and caches go unsaid, as git leaves them)."""
    ignore = Ignore()
    entries: list[dict[str, Any]] = []
    left_out: list[str] = []
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for current, subfolders, names in os.walk(folder):
            here = Path(current)
            ignore.read(here)
            for name in sorted(subfolders):
                path = here / name
                if path.is_symlink():
                    subfolders.remove(name)
                    left_out.append(f"{path.relative_to(folder).as_posix()}/ (a link)")
                elif name in ALWAYS_LEFT_OUT or (path / "pyvenv.cfg").exists():
                    subfolders.remove(name)
                elif ignore.ignored(path, is_folder=True):
                    subfolders.remove(name)
                    left_out.append(f"{path.relative_to(folder).as_posix()}/")
            subfolders.sort()
            for name in sorted(names):
                path = here / name
                relative = path.relative_to(folder).as_posix()
                if path.is_symlink():
                    left_out.append(f"{relative} (a link)")
                    continue
                if not path.is_file() or name.endswith((".pyc", ".pyo")):
                    continue
                if ignore.ignored(path, is_folder=False):
                    left_out.append(relative)
                    continue
                content = path.read_bytes()
                entries.append({"path": relative, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()})
                info = archive.gettarinfo(str(path), arcname=relative)
                archive.addfile(info, io.BytesIO(content))
    return Packed(buffer.getvalue(), entries, left_out)


class FolderError(TowerqError):
    """A folder that cannot be sent as a code bundle: missing, with nothing to send, or over
    the limit (the message names its biggest files)."""


def packed_folder(folder: Path) -> Packed:
    """`pack(folder)`, refused (`FolderError`) where it cannot be a bundle."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: no such folder")
    packed = pack(folder)
    if not packed.entries:
        raise FolderError(f"{folder}: no files to send (all left out, or the folder is empty)")
    if packed.size > BUNDLE_LIMIT_BYTES:
        biggest = sorted(packed.entries, key=lambda e: -int(e["size"]))[:5]
        named = ", ".join(f"{e['path']} ({megabytes(int(e['size']))})" for e in biggest)
        raise FolderError(
            f"{folder} holds {megabytes(packed.size)} of files, over the {megabytes(BUNDLE_LIMIT_BYTES)} a code bundle "
            f"may hold; the biggest: {named}. Name data and weights in .towerqignore and upload data as a "
            "dataset (towerq data upload)"
        )
    return packed


@dataclass(frozen=True)
class Sent:
    """A folder's bundle on the API (`Client.send_code`)."""

    id: str
    files: int
    size: int
    """Bytes of its files."""
    left_out: list[str]
    sent: bool
    """False: the API held the same files already, nothing was sent."""

    def __str__(self) -> str:
        note = f"; left out: {', '.join(self.left_out[:10])}" if self.left_out else ""
        how = "sent" if self.sent else "already there"
        files = f"{self.files} file{'' if self.files == 1 else 's'}"
        return f"code: {files}, {human_bytes(self.size)}, bundle {self.id[:12]} ({how}){note}"


def human_bytes(count: float) -> str:
    """A size as people read it: 37 B, 4.2 kB, 12.0 MB."""
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
