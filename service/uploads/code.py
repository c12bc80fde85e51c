"""Code bundles: a user's model code, uploaded once, stored content-addressed, run by jobs.

A bundle is one `.py` file, or a `.zip` / `.tar.gz` of a folder. It is unpacked with every
limit checked as the bytes arrive (never trusting an archive's own sizes: no zip bombs),
every path checked (no absolute paths, no `..`, no links), and stored read-only under
`TOWERQ_CODE_DIR/<id>/files/` with a `manifest.json` beside it. The id is the SHA-256 of
the manifest (each file's path, size and SHA-256, sorted), so the same code uploaded twice,
in any archive format, is stored once. Nothing is stored when an upload is refused: it is
unpacked into a scratch folder and renamed into place only when complete.

Who uploaded a bundle is recorded as a file `TOWERQ_CODE_DIR/.owners/<user>/<id>` holding its size:
a bundle is private to its uploaders (and admins, and readers of a job that runs on it:
service/jobs/privacy.py), and counts against each uploader's code quota
(TOWERQ_USER_CODE_QUOTA_BYTES), checked and recorded under a per-user lock so that parallel
uploads cannot each take the whole room.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

from service.core.exceptions import NotFoundError, SpecError, TooLargeError
from service.uploads.quota import held as quota_lock
from service.uploads.unpack import Limits, Unpacker, read_only, writable
from towerq.contract import paths, spec
from towerq.contract.paths import BUNDLE_FILES, bundle_root

BUNDLE_ID = re.compile(spec.BUNDLE_ID)
MANIFEST = "manifest.json"
OWNERS = ".owners"


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


def owns(code_dir: Path, user: str, bundle_id: str) -> bool:
    """Whether `user` uploaded this bundle."""
    return bool(BUNDLE_ID.match(bundle_id)) and (code_dir.resolve() / OWNERS / user / bundle_id).is_file()


def usage(code_dir: Path, user: str) -> int:
    """Bytes (unpacked) of the bundles `user` uploaded: each owner mark holds its bundle's
    size (written before the bundle is in place, so a parallel upload counts it already)."""
    mine = code_dir.resolve() / OWNERS / user
    total = 0
    for marker in mine.iterdir() if mine.is_dir() else []:
        if BUNDLE_ID.match(marker.name):
            try:
                total += int(marker.read_text() or 0)
            except (OSError, ValueError):
                continue
    return total


def _claim(code_dir: Path, user: str, described: dict[str, Any], quota: int) -> None:
    """Record `user` as an uploader of the bundle, within their quota (TooLargeError)."""
    mine = code_dir / OWNERS / user
    with quota_lock(mine / ".quota.lock"):
        if (mine / described["id"]).is_file():
            return
        used = usage(code_dir, user)
        if used + described["size"] > quota:
            raise TooLargeError(
                "file",
                f"over your code quota (TOWERQ_USER_CODE_QUOTA_BYTES): your bundles take {used:,} of "
                f"{quota:,} bytes and this one {described['size']:,}",
            )
        (mine / described["id"]).write_text(str(described["size"]))


def store(
    upload: IO[bytes], filename: str, code_dir: Path, limits: Limits, user: str, quota: int
) -> tuple[dict[str, Any], bool]:
    """Unpack and store the uploaded `filename` as `user`'s; returns (its manifest, whether
    it is new)."""
    kind = _kind(filename)
    code_dir = code_dir.resolve()
    code_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".incoming-", dir=code_dir))
    try:
        files = scratch / BUNDLE_FILES
        files.mkdir()
        writer = Unpacker(files, limits)
        if kind == "py":
            writer.add(PurePosixPath(filename).name, upload)
        elif kind == "zip":
            writer.unzip(upload)
        else:
            writer.untar(upload)
        if not writer.entries:
            raise SpecError("file", "the archive holds no files")
        entries = sorted(writer.entries, key=lambda entry: entry["path"])
        bundle_id = paths.bundle_id(entries)
        described = {
            "id": bundle_id,
            "files": [{"path": e["path"], "size": e["size"]} for e in entries],
            "size": sum(e["size"] for e in entries),
            "sha256": {e["path"]: e["sha256"] for e in entries},
        }
        target = code_dir / bundle_id
        _claim(code_dir, user, described, quota)
        if (target / MANIFEST).is_file():
            return described, False
        (scratch / MANIFEST).write_text(json.dumps(described, indent=1))
        read_only(scratch)
        try:
            os.rename(scratch, target)
        except OSError:  # the same bundle arrived at the same moment from elsewhere
            if not (target / MANIFEST).is_file():
                raise
            return described, False
        return described, True
    finally:
        if scratch.exists():
            writable(scratch)
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
