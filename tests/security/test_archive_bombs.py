"""Uploaded archives as a weapon against the API's memory: `untar` read `r:*` (bz2 and xz
pass as `.tar.gz`, and bz2 compresses directory headers about 38,000:1), counted only
files (not folders), read headers of any size, and tarfile kept every entry in memory.
Now: gzip only, streamed, every entry counted, each header bounded, nothing kept."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest

from service.uploads.unpack import HEADER_BYTES
from tests.service.api.conftest import Api

pytestmark = pytest.mark.usefixtures("settings")


def archive(mode: str, build: callable) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode, format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    return buffer.getvalue()


def add_file(tar: tarfile.TarFile, name: str, data: bytes, pax: dict[str, str] | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    if pax:
        info.pax_headers = pax
    tar.addfile(info, io.BytesIO(data))


def add_folders(tar: tarfile.TarFile, count: int) -> None:
    for i in range(count):
        info = tarfile.TarInfo(f"d{i}")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    add_file(tar, "net.py", b"X = 1\n")


def upload(api: Api, name: str, data: bytes):
    return api.post("/api/code", files={"file": (name, data)})


def test_a_bz2_archive_named_tar_gz_is_refused(alice: Api) -> None:
    sneaky = archive("w:bz2", lambda tar: add_file(tar, "net.py", b"X = 1\n"))
    refused = upload(alice, "lab.tar.gz", sneaky)
    assert refused.status_code == 422 and "not a readable .tar.gz" in refused.text, refused.text


def test_folder_entries_count_against_the_limit(alice: Api) -> None:
    """2,500 folders (the default limit is 2,000 files) in a few KB."""
    many = archive("w:gz", lambda tar: add_folders(tar, 2_500))
    assert len(many) < 100_000
    refused = upload(alice, "lab.tar.gz", many)
    assert refused.status_code == 413 and "more than 2000 files and folders" in refused.text, refused.text


def test_folder_entries_of_a_zip_count_too(alice: Api) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for i in range(2_500):
            zipped.writestr(f"d{i}/", b"")
        zipped.writestr("net.py", b"X = 1\n")
    refused = upload(alice, "lab.zip", buffer.getvalue())
    assert refused.status_code == 413 and "more than 2000 files and folders" in refused.text, refused.text


def test_a_huge_header_is_refused_before_it_is_read_whole(alice: Api) -> None:
    padded = archive("w:gz", lambda tar: add_file(tar, "net.py", b"X = 1\n", {"comment": "x" * (HEADER_BYTES * 4)}))
    refused = upload(alice, "lab.tar.gz", padded)
    assert refused.status_code == 413 and "header is over" in refused.text, refused.text


def test_a_plain_tar_gz_still_unpacks(alice: Api) -> None:
    fine = archive("w:gz", lambda tar: add_folders(tar, 10))
    created = upload(alice, "lab.tar.gz", fine)
    assert created.status_code == 201, created.text
