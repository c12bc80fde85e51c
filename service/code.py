"""Code bundles: a user's model code, uploaded once, stored content-addressed, run by jobs.

A bundle is one `.py` file, or a `.zip` / `.tar.gz` of a folder. It is unpacked with every
limit checked as the bytes arrive (never trusting an archive's own sizes: no zip bombs),
every path checked (no absolute paths, no `..`, no links), and stored read-only under
`TOWERQ_CODE_DIR/<id>/files/` with a `manifest.json` beside it. The id is the SHA-256 of
the manifest (each file's path, size and SHA-256, sorted), so the same code uploaded twice,
in any archive format, is stored once. Nothing is stored when an upload is refused: it is
unpacked into a scratch folder and renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from service.exceptions import NotFoundError, SpecError, TooLargeError
from worker.trainer.paths import BUNDLE_FILES, PathEscapeError, bundle_root, check_relative

BUNDLE_ID = re.compile(r"^[0-9a-f]{64}$")
MANIFEST = "manifest.json"
CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    packed_bytes: int
    files: int
    unpacked_bytes: int


def check_id(bundle_id: str) -> str:
    if not BUNDLE_ID.match(bundle_id):
        raise SpecError("code", f"{bundle_id!r} is not a bundle id (64 hex digits, as POST /api/code returns)")
    return bundle_id


def manifest(code_dir: Path, bundle_id: str) -> dict[str, Any]:
    """The bundle's id, files and size; NotFoundError when there is no such bundle."""
    path = code_dir.resolve() / check_id(bundle_id) / MANIFEST
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise NotFoundError(f"no code bundle {bundle_id}: upload it with POST /api/code") from None


def exists(code_dir: Path, bundle_id: str) -> bool:
    return bool(BUNDLE_ID.match(bundle_id)) and (code_dir.resolve() / bundle_id / MANIFEST).is_file()


def bundle_file(code_dir: Path, bundle_id: str, path: str) -> Path:
    """One file of a bundle (its path as the manifest lists it)."""
    listed = {entry["path"] for entry in manifest(code_dir, bundle_id)["files"]}
    if path not in listed:
        raise NotFoundError(f"bundle {bundle_id[:12]}… has no file {path!r}")
    return bundle_root(code_dir, bundle_id) / path


def store(upload: IO[bytes], filename: str, code_dir: Path, limits: Limits) -> tuple[dict[str, Any], bool]:
    """Unpack and store the uploaded `filename`; returns (its manifest, whether it is new)."""
    kind = _kind(filename)
    code_dir = code_dir.resolve()
    code_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".incoming-", dir=code_dir))
    try:
        files = scratch / BUNDLE_FILES
        files.mkdir()
        writer = _Writer(files, limits)
        if kind == "py":
            name = PurePosixPath(filename).name
            writer.add(name, upload)
        elif kind == "zip":
            _unzip(upload, writer)
        else:
            _untar(upload, writer)
        if not writer.entries:
            raise SpecError("file", "the archive holds no files")
        entries = sorted(writer.entries, key=lambda entry: entry["path"])
        bundle_id = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()
        described = {
            "id": bundle_id,
            "files": [{"path": e["path"], "size": e["size"]} for e in entries],
            "size": sum(e["size"] for e in entries),
            "sha256": {e["path"]: e["sha256"] for e in entries},
        }
        target = code_dir / bundle_id
        if (target / MANIFEST).is_file():
            return described, False
        (scratch / MANIFEST).write_text(json.dumps(described, indent=1))
        _read_only(scratch)
        try:
            os.rename(scratch, target)
        except OSError:  # the same bundle arrived at the same moment from elsewhere
            if not (target / MANIFEST).is_file():
                raise
            return described, False
        return described, True
    finally:
        if scratch.exists():
            _writable(scratch)
            shutil.rmtree(scratch, ignore_errors=True)


def _kind(filename: str) -> str:
    lower = filename.lower()
    if lower.endswith(".py"):
        return "py"
    if lower.endswith(".zip"):
        return "zip"
    if lower.endswith((".tar.gz", ".tgz")):
        return "tar"
    raise SpecError("file", f"{filename!r}: a bundle is a .py file, or a .zip or .tar.gz of a folder")


class _Writer:
    """Writes checked members into the scratch folder, counting files and unpacked bytes."""

    def __init__(self, root: Path, limits: Limits) -> None:
        self.root = root
        self.limits = limits
        self.entries: list[dict[str, Any]] = []
        self.unpacked = 0

    def add(self, name: str, source: IO[bytes]) -> None:
        path = _member_path(name)
        if len(self.entries) >= self.limits.files:
            raise TooLargeError("file", f"more than {self.limits.files} files (TOWERQ_MAX_CODE_FILES)")
        target = self.root / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            out = target.open("xb")
        except OSError:  # FileExistsError, or a folder and a file of one name
            raise SpecError("file", f"{path!r} appears twice in the archive, or clashes with a folder") from None
        digest = hashlib.sha256()
        size = 0
        with out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                self.unpacked += len(chunk)
                if self.unpacked > self.limits.unpacked_bytes:
                    raise TooLargeError(
                        "file",
                        f"unpacks to more than {self.limits.unpacked_bytes} bytes (TOWERQ_MAX_CODE_UNPACKED_BYTES)",
                    )
                digest.update(chunk)
                out.write(chunk)
        self.entries.append({"path": path, "size": size, "sha256": digest.hexdigest()})


def _member_path(name: str) -> str:
    try:
        pure = check_relative(name.rstrip("/"))
    except PathEscapeError as err:
        raise SpecError("file", f"archive member {name!r}: {str(err).replace(' to the data folder', '')}") from None
    parts = [part for part in pure.parts if part not in ("", ".")]
    if not parts:
        raise SpecError("file", f"archive member {name!r} has no name")
    return "/".join(parts)


def _unzip(upload: IO[bytes], writer: _Writer) -> None:
    try:
        archive = zipfile.ZipFile(upload)
    except zipfile.BadZipFile as err:
        raise SpecError("file", f"not a readable .zip: {err}") from None
    with archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            mode = info.external_attr >> 16
            if mode and (mode & 0o170000) == 0o120000:
                raise SpecError("file", f"archive member {info.filename!r} is a link: bundles hold plain files")
            try:
                with archive.open(info) as member:
                    writer.add(info.filename, member)
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError) as err:
                raise SpecError("file", f"cannot read {info.filename!r} from the .zip: {err}") from None


def _untar(upload: IO[bytes], writer: _Writer) -> None:
    try:
        archive = tarfile.open(fileobj=upload, mode="r:*")
    except tarfile.TarError as err:
        raise SpecError("file", f"not a readable .tar.gz: {err}") from None
    with archive:
        try:
            for info in archive:
                if info.isdir():
                    continue
                if not info.isfile():
                    what = "a link" if info.issym() or info.islnk() else "not a plain file"
                    raise SpecError("file", f"archive member {info.name!r} is {what}: bundles hold plain files")
                member = archive.extractfile(info)
                assert member is not None
                writer.add(info.name, member)
        except (tarfile.TarError, EOFError, OSError) as err:
            raise SpecError("file", f"cannot read the .tar.gz: {err}") from None


def _read_only(root: Path) -> None:
    for folder, _, names in os.walk(root):
        for name in names:
            os.chmod(Path(folder) / name, 0o444)
        os.chmod(folder, 0o555)


def _writable(root: Path) -> None:
    for folder, _, names in os.walk(root):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(Path(folder) / name, 0o644)
