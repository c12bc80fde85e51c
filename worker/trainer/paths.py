"""Resolving user-given paths inside a root folder, refusing anything that escapes it."""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class PathEscapeError(ValueError):
    """A user path that is absolute, climbs with `..`, or leads outside its root via a link."""


JOB_LOG_FILE = "log.txt"
"""The whole log of a job (every attempt), beside its checkpoints: the relay appends to it."""


MODEL_FILE = "model.keras"
"""The trained model a run exports at its end (EMA weights when `ema_decay` is set)."""


BUNDLE_FILES = "files"
"""A code bundle's files, under `<TOWERQ_CODE_DIR>/<id>/` beside its manifest."""


def bundle_root(code_dir: Path, bundle_id: str) -> Path:
    """The folder a job's code bundle is unpacked in: first on the trainer's import path."""
    return code_dir.resolve() / bundle_id / BUNDLE_FILES


def job_folder(artifacts_root: Path, job_id: int) -> Path:
    """Where one job's artifacts live: `<TOWERQ_ARTIFACTS_DIR>/job-<id>` (shared storage, so
    the worker that writes them and the API that serves them agree)."""
    return artifacts_root.resolve() / f"job-{job_id}"


def check_relative(path: str) -> PurePosixPath:
    """The path as a relative POSIX path; raises when it is absolute or contains `..`."""
    if not path or "\x00" in path:
        raise PathEscapeError("must be a non-empty relative path")
    pure = PurePosixPath(path)
    if pure.is_absolute() or "\\" in path:
        raise PathEscapeError(f"{path!r} must be relative to the data folder, not absolute")
    if ".." in pure.parts:
        raise PathEscapeError(f"{path!r} must not contain '..'")
    return pure


def resolve_inside(root: Path, path: str) -> Path:
    """`root / path` with every symlink resolved; raises unless it stays inside `root`."""
    relative = check_relative(path)
    real_root = root.resolve()
    resolved = (real_root / relative).resolve()
    if resolved != real_root and real_root not in resolved.parents:
        raise PathEscapeError(f"{path!r} leads outside {root} (through a symbolic link)")
    return resolved
