"""A job's artifacts as the API serves them: listing, one file, a folder as a .tar.gz stream.

Artifacts live in `TOWERQ_ARTIFACTS_DIR/job-<id>/` on storage the workers and the API share.
Every path a caller names is confined to that folder (no absolute paths, no `..`, no links
leading out), as for datasets.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.exceptions import NotFoundError, SpecError
from worker.trainer.paths import PathEscapeError, resolve_inside

LIST_LIMIT = 10_000
CHUNK_BYTES = 256 * 1024


def _files(root: Path) -> list[Path]:
    """Regular files under `root`, sorted by path, not following links (a link could lead out)."""
    found = [
        Path(folder) / name
        for folder, _, names in os.walk(root)
        for name in names
        if (Path(folder) / name).is_file() and not (Path(folder) / name).is_symlink()
    ]
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def list_artifacts(root: Path) -> dict[str, Any]:
    """Files under the job's folder: path (relative), size, modified (UTC)."""
    items: list[dict[str, Any]] = []
    total = 0
    truncated = False
    if root.is_dir():
        for path in _files(root):
            if len(items) >= LIST_LIMIT:
                truncated = True
                break
            stat = path.stat()
            total += stat.st_size
            modified = datetime.fromtimestamp(stat.st_mtime, UTC)
            items.append({"path": path.relative_to(root).as_posix(), "size": stat.st_size, "modified": modified})
    return {"items": items, "total_bytes": total, "truncated": truncated}


def resolve_artifact(root: Path, path: str) -> Path:
    """The file or folder `path` names inside the job's folder."""
    try:
        found = resolve_inside(root, path)
    except PathEscapeError as err:
        raise SpecError("path", f"{path!r} is not inside the job's artifacts (absolute, '..', or a link out)") from err
    if not found.exists():
        raise NotFoundError(f"no artifact {path!r}")
    return found


def tar_gz_stream(folder: Path, top: str) -> Iterator[bytes]:
    """`folder` as a .tar.gz, produced by a thread into a pipe while it is sent, so a large
    folder never sits in memory; stopping the iteration (the client left) stops the thread."""
    read_fd, write_fd = os.pipe()

    def produce() -> None:
        try:
            with os.fdopen(write_fd, "wb") as sink, tarfile.open(fileobj=sink, mode="w|gz") as archive:
                for path in _files(folder):
                    archive.add(path, arcname=f"{top}/{path.relative_to(folder).as_posix()}", recursive=False)
        except OSError:  # the reader went away (broken pipe), or a file vanished mid-read
            pass

    producer = threading.Thread(target=produce, name=f"tar {top}", daemon=True)
    producer.start()
    with os.fdopen(read_fd, "rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            yield chunk
    producer.join()
