"""Datasets users upload: stored under `TOWERQ_DATA_DIR/users/<user>/<name>/`, private to
their owner, within a per-user quota.

An upload is an `.npz` (arrays `x, y` or `x_train, y_train, x_test, y_test`), a TFRecord
file (records of `image` bytes and an integer `label`), or a `.zip` of an image folder
(one sub-folder per class). Each becomes a folder holding `data.npz`, `data.tfrecord` or
`images/`, plus `dataset.json` naming what a job spec writes to use it (e.g.
`npz:users/alice/cells/data.npz`). The lab's shared data is everything else under
`TOWERQ_DATA_DIR`, placed there by an admin.

Nothing is stored when an upload is refused: it is written into a scratch folder and
renamed into place only when complete and within the quota.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any

from service.core.exceptions import NotFoundError, SpecError, StateConflictError, TooLargeError
from service.uploads.quota import held as quota_lock
from service.uploads.unpack import Limits, Unpacker, writable
from towerq.contract.api import DATASET_NAME, dataset_name_problem

USERS = "users"
DESCRIPTION = "dataset.json"
CHUNK = 1024 * 1024
MAX_IMAGE_FILES = 1_000_000


def user_folder(data_dir: Path, user: str) -> Path:
    return data_dir.resolve() / USERS / user


GLOB_CHARACTERS = frozenset("*?[")


def reaches_others(relative: str, user: str) -> str | None:
    """Whose uploads a data path or pattern could reach besides `user`'s, as a reason to
    refuse it, else None. A pattern is judged by what it could match, not by its letters:
    `u*/alice/cells/*.tfrecord` or `*/alice/...` reach `users/alice/` as surely as the
    literal path does, now or once alice uploads."""
    parts = PurePosixPath(relative).parts
    if not parts or not fnmatch.fnmatchcase(USERS, parts[0]):
        return None
    owner = parts[1] if len(parts) >= 2 else "*"
    if GLOB_CHARACTERS & set(owner):
        return f"{relative!r} could match other users' uploads ({USERS}/{owner}): name your own, {USERS}/{user}/..."
    if owner != user:
        return f"{relative!r} is {owner}'s upload: only {owner}'s jobs may use it"
    return None


def usage(data_dir: Path, user: str) -> int:
    """Bytes the user's uploads take (their data; not the small descriptions beside it)."""
    root = user_folder(data_dir, user)
    return sum(
        path.stat().st_size
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and path.name != DESCRIPTION
    )


def list_own(data_dir: Path, user: str) -> list[dict[str, Any]]:
    root = user_folder(data_dir, user)
    found = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        description = folder / DESCRIPTION
        if folder.name.startswith(".") or not description.is_file():
            continue
        found.append(json.loads(description.read_text()))
    return found


def store(
    upload: IO[bytes], filename: str, name: str, data_dir: Path, user: str, quota: int, max_files: int
) -> dict[str, Any]:
    """Store the upload as the user's dataset `name`; returns its description."""
    if problem := dataset_name_problem(name):
        raise SpecError("name", problem)
    lower = filename.lower()
    if lower.endswith(".npz"):
        kind = "npz"
    elif lower.endswith((".tfrecord", ".tfrecords")):
        kind = "tfrecord"
    elif lower.endswith(".zip"):
        kind = "images"
    else:
        raise SpecError("file", f"{filename!r}: a dataset is an .npz, a .tfrecord, or a .zip of an image folder")
    root = user_folder(data_dir, user)
    target = root / name
    if target.exists():
        raise StateConflictError(f"you have a dataset {name!r} already: delete it first (DELETE /api/datasets/{name})")
    # The room is checked and spent by one upload at a time; the lock lives beside the
    # users' folders (no user name starts with a dot), so nothing shows in the user's own.
    with quota_lock(data_dir.resolve() / USERS / ".locks" / f"{user}.lock"):
        return _store_within(upload, kind, name, root, user, quota - usage(data_dir, user), max_files)


def _store_within(
    upload: IO[bytes], kind: str, name: str, root: Path, user: str, room: int, max_files: int
) -> dict[str, Any]:
    target = root / name
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".incoming-", dir=root))
    try:
        if kind == "images":
            relative = _unzip_images(upload, scratch, room, max_files)
        else:
            relative = f"data.{kind}"
            _copy(upload, scratch / relative, room)
            if kind == "npz":
                _check_npz(scratch / relative)
        size = sum(p.stat().st_size for p in scratch.rglob("*") if p.is_file())
        reference = f"{kind}:{USERS}/{user}/{name}/{relative}"
        described = {
            "name": name,
            "owner": user,
            "kind": kind,
            "dataset": reference,
            "size": size,
            "created": datetime.now(UTC).isoformat(),
        }
        (scratch / DESCRIPTION).write_text(json.dumps(described, indent=1))
        try:
            os.rename(scratch, target)
        except OSError:
            raise StateConflictError(f"you have a dataset {name!r} already: delete it first") from None
        return described
    finally:
        if scratch.exists():
            writable(scratch)
            shutil.rmtree(scratch, ignore_errors=True)


def remove(data_dir: Path, user: str, name: str) -> None:
    if not DATASET_NAME.match(name):
        raise NotFoundError(f"you have no dataset {name!r}")
    target = user_folder(data_dir, user) / name
    if not (target / DESCRIPTION).is_file():
        raise NotFoundError(f"you have no dataset {name!r}")
    trash = target.with_name(f".removing-{name}-{os.getpid()}")
    os.rename(target, trash)  # gone from every listing at once, then deleted
    shutil.rmtree(trash, ignore_errors=True)


def _over_quota(room: int) -> TooLargeError:
    return TooLargeError("file", f"over your data quota (TOWERQ_USER_DATA_QUOTA_BYTES): {max(room, 0)} bytes left")


def _copy(upload: IO[bytes], target: Path, room: int) -> None:
    written = 0
    with target.open("xb") as out:
        while chunk := upload.read(CHUNK):
            written += len(chunk)
            if written > room:
                raise _over_quota(room)
            out.write(chunk)
    if not written:
        raise SpecError("file", "the file is empty")


def _check_npz(path: Path) -> None:
    """An .npz is a zip of .npy arrays: check the names the trainer reads are there."""
    try:
        with zipfile.ZipFile(path) as archive:
            arrays = {name.removesuffix(".npy") for name in archive.namelist()}
    except zipfile.BadZipFile:
        raise SpecError("file", "not a readable .npz (numpy.savez writes one)") from None
    if not ({"x", "y"} <= arrays or {"x_train", "y_train", "x_test", "y_test"} <= arrays):
        raise SpecError(
            "file", f"the .npz must hold x, y (or x_train, y_train, x_test, y_test); it has {sorted(arrays)}"
        )


def _unzip_images(upload: IO[bytes], scratch: Path, room: int, max_files: int) -> str:
    """Unpack an image folder; returns the folder holding the class sub-folders."""
    images = scratch / "images"
    images.mkdir()
    limits = Limits(room, max_files, room, "TOWERQ_MAX_DATASET_FILES", "TOWERQ_USER_DATA_QUOTA_BYTES")
    Unpacker(images, limits).unzip(upload)
    folder = images
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir() and any(p.is_dir() for p in entries[0].iterdir()):
        folder = entries[0]  # the zip of a folder: its classes are one level down
    if not any(p.is_dir() for p in folder.iterdir()):
        raise SpecError("file", "an image folder holds one sub-folder per class; this .zip has none")
    return folder.relative_to(scratch).as_posix()
