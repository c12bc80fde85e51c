"""Packages for a test's own index (a folder pip reads with `--no-index --find-links`): a
wheel written as pip reads one (a zip with the module and its `.dist-info`), and an sdist
whose `setup.py` runs when it is built. Nothing is downloaded or built."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from pathlib import Path


def wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """`name`-`version` as a pure-Python wheel in `folder` holding `files` (path: text, as
    installed in site-packages; a path may try to leave it)."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    entries = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: towerq-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},{_digest(text.encode())},{len(text.encode())}" for path, text in entries.items()]
    entries[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name_in, text in entries.items():
            archive.writestr(name_in, text)
    return path


def sdist(folder: Path, name: str, version: str, setup_py: str) -> Path:
    """`name`-`version` as a source distribution: what pip builds runs `setup_py`."""
    dist = f"{name}-{version}"
    path = folder / f"{dist}.tar.gz"
    entries = {"setup.py": setup_py, "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}
    with tarfile.open(path, "w:gz") as archive:
        for name_in, text in entries.items():
            data = text.encode()
            member = tarfile.TarInfo(f"{dist}/{name_in}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return path


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
