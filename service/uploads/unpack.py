"""Unpacking what users upload (code bundles, image-folder datasets) without trusting it.

Every member's path is checked (relative, no `..`), links and special files are refused,
and the file count and the unpacked bytes are counted as the bytes are written, never
taken from the archive's own headers: a zip bomb stops at the limit. Errors name the
form field and the setting that limits it.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from service.core.exceptions import SpecError, TooLargeError
from towerq.contract.paths import PathEscapeError, check_relative

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    packed_bytes: int
    files: int
    unpacked_bytes: int
    files_setting: str = "TOWERQ_MAX_CODE_FILES"
    unpacked_setting: str = "TOWERQ_MAX_CODE_UNPACKED_BYTES"


class Unpacker:
    """Writes checked members under `root`, counting files and unpacked bytes."""

    def __init__(self, root: Path, limits: Limits, field: str = "file") -> None:
        self.root = root
        self.limits = limits
        self.field = field
        self.entries: list[dict[str, Any]] = []
        self.unpacked = 0

    def add(self, name: str, source: IO[bytes]) -> None:
        path = self._member_path(name)
        if len(self.entries) >= self.limits.files:
            raise TooLargeError(self.field, f"more than {self.limits.files} files ({self.limits.files_setting})")
        target = self.root / path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            out = target.open("xb")
        except OSError:  # FileExistsError, or a folder and a file of one name
            raise SpecError(self.field, f"{path!r} appears twice in the archive, or clashes with a folder") from None
        digest = hashlib.sha256()
        size = 0
        with out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                self.unpacked += len(chunk)
                if self.unpacked > self.limits.unpacked_bytes:
                    raise TooLargeError(
                        self.field,
                        f"unpacks to more than {self.limits.unpacked_bytes} bytes ({self.limits.unpacked_setting})",
                    )
                digest.update(chunk)
                out.write(chunk)
        self.entries.append({"path": path, "size": size, "sha256": digest.hexdigest()})

    def _member_path(self, name: str) -> str:
        try:
            pure = check_relative(name.rstrip("/"))
        except PathEscapeError as err:
            message = str(err).replace(" to the data folder", "")
            raise SpecError(self.field, f"archive member {name!r}: {message}") from None
        parts = [part for part in pure.parts if part not in ("", ".")]
        if not parts:
            raise SpecError(self.field, f"archive member {name!r} has no name")
        return "/".join(parts)

    def unzip(self, upload: IO[bytes]) -> None:
        try:
            archive = zipfile.ZipFile(upload)
        except zipfile.BadZipFile as err:
            raise SpecError(self.field, f"not a readable .zip: {err}") from None
        with archive:
            if len(archive.infolist()) > self.limits.files:  # folders count: each is an entry held in memory
                raise TooLargeError(
                    self.field, f"more than {self.limits.files} files and folders ({self.limits.files_setting})"
                )
            for info in archive.infolist():
                if info.is_dir():
                    continue
                mode = info.external_attr >> 16
                if mode and (mode & 0o170000) == 0o120000:
                    raise SpecError(self.field, f"archive member {info.filename!r} is a link: only plain files")
                try:
                    with archive.open(info) as member:
                        self.add(info.filename, member)
                except (zipfile.BadZipFile, NotImplementedError, RuntimeError) as err:
                    raise SpecError(self.field, f"cannot read {info.filename!r} from the .zip: {err}") from None

    def untar(self, upload: IO[bytes]) -> None:
        """A .tar.gz, streamed (`r|`): gzip only (bz2 and xz headers compress far better, so a
        small upload could hold millions of entries), every entry counted against the file
        limit (folders too), the bytes of each header and its padding bounded, and no entry
        kept in memory once it is written."""
        stream = _HeaderBudget(cast(IO[bytes], gzip.GzipFile(fileobj=upload, mode="rb")), self.field)
        try:
            archive = tarfile.open(fileobj=cast(IO[bytes], stream), mode="r|")  # it only reads
            with archive:
                seen = 0
                while True:
                    stream.start_header()
                    info = archive.next()
                    if info is None:
                        break
                    archive.members.clear()  # type: ignore[attr-defined]  # tarfile keeps each entry: 75 MB per 200,000
                    seen += 1
                    if seen > self.limits.files:
                        raise TooLargeError(
                            self.field, f"more than {self.limits.files} files and folders ({self.limits.files_setting})"
                        )
                    stream.in_header = False
                    self._tar_member(archive, info)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
            raise SpecError(self.field, f"not a readable .tar.gz: {err}") from None

    def _tar_member(self, archive: tarfile.TarFile, info: tarfile.TarInfo) -> None:
        if info.isdir():
            return
        if not info.isfile():
            what = "a link" if info.issym() or info.islnk() else "not a plain file"
            raise SpecError(self.field, f"archive member {info.name!r} is {what}: only plain files")
        member = archive.extractfile(info)
        assert member is not None
        self.add(info.name, member)


HEADER_BYTES = 64 * 1024
"""The most an entry's header may take (with the padding before it): a pax header with a
4,096-character path is under 10 KB; tarfile would read a header of any size into memory."""


class _HeaderBudget:
    """The decompressed tar stream, counting what is read while tarfile reads a header."""

    def __init__(self, source: IO[bytes], field: str) -> None:
        self.source = source
        self.field = field
        self.in_header = True
        self.left = HEADER_BYTES

    def start_header(self) -> None:
        self.in_header, self.left = True, HEADER_BYTES

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size if size >= 0 else CHUNK)
        if self.in_header:
            self.left -= len(data)
            if self.left < 0:
                raise TooLargeError(self.field, f"an archive entry's header is over {HEADER_BYTES} bytes")
        return data


def read_only(root: Path) -> None:
    for folder, _, names in os.walk(root):
        for name in names:
            os.chmod(Path(folder) / name, 0o444)
        os.chmod(folder, 0o555)


def writable(root: Path) -> None:
    for folder, _, names in os.walk(root):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(Path(folder) / name, 0o644)
