"""Code bundles over the API: stored once by content, listed and read back, refused with the
cause named (zip-slip, links, bombs, too many or too large) and nothing stored then; jobs
name them and are refused when the bundle or its module is missing."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.settings import Settings
from tests.service.api.conftest import Api

NET = b"import keras\n\ndef build(params):\n    return keras.Sequential([keras.layers.Dense(params['num_classes'])])\n"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], database_url: str) -> Settings:
    return make_settings(database_url, max_code_bytes=200_000, max_code_files=5, max_code_unpacked_bytes=1_000_000)


def upload(api: Api, name: str, data: bytes):
    return api.post("/api/code", files={"file": (name, data)})


def zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def tarred(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    return buffer.getvalue()


def stored(settings: Settings) -> list[str]:
    return sorted(n for n in os.listdir(settings.code_dir) if n != ".owners") if settings.code_dir.exists() else []


def test_a_file_is_stored_once_by_content_whatever_the_archive(alice: Api, settings: Settings) -> None:
    first = upload(alice, "net.py", NET)
    assert first.status_code == 201, first.text
    bundle = first.json()
    assert len(bundle["id"]) == 64 and bundle["files"] == [{"path": "net.py", "size": len(NET)}]
    assert bundle["size"] == len(NET)
    again = upload(alice, "net.zip", zipped({"net.py": NET}))
    assert again.status_code == 200 and again.json()["id"] == bundle["id"]
    assert stored(settings) == [bundle["id"]]
    assert alice.get(f"/api/code/{bundle['id']}").json() == bundle
    text = alice.get(f"/api/code/{bundle['id']}/files/net.py")
    assert text.content == NET and text.headers["content-type"].startswith("text/plain")
    on_disk = settings.code_dir / bundle["id"] / "files" / "net.py"
    assert on_disk.stat().st_mode & 0o777 == 0o444  # read-only: a job cannot change its code


def test_a_folder_keeps_its_layout(alice: Api) -> None:
    members = {"lab/__init__.py": b"", "lab/nets.py": NET, "lab/util/helpers.py": b"X = 1\n", "README.md": b"# lab\n"}
    bundle = upload(alice, "lab.tar.gz", tarred(members)).json()
    assert [f["path"] for f in bundle["files"]] == sorted(members)
    assert alice.get(f"/api/code/{bundle['id']}/files/lab/util/helpers.py").text == "X = 1\n"
    assert alice.get(f"/api/code/{bundle['id']}/files/lab/missing.py").status_code == 404


@pytest.mark.parametrize(
    ("name", "data", "status", "cause"),
    [
        ("slip.zip", zipped({"../evil.py": b"x"}), 422, "must not contain '..'"),
        ("abs.tar.gz", tarred({"/etc/evil.py": b"x"}), 422, "must be relative"),
        ("link.tar.gz", tarred({"a.py": b"x"}, links={"b.py": "/etc/passwd"}), 422, "is a link"),
        ("bomb.zip", zipped({"zeros.py": b"\0" * 5_000_000}), 413, "TOWERQ_MAX_CODE_UNPACKED_BYTES"),
        ("many.zip", zipped({f"m{i}.py": b"" for i in range(6)}), 413, "more than 5 files"),
        ("big.py", os.urandom(300_000), 413, "TOWERQ_MAX_CODE_BYTES"),
        ("notes.txt", b"hello", 422, "a bundle is a .py file, or a .zip or .tar.gz"),
        ("broken.zip", b"PK\x03\x04 not really", 422, "not a readable .zip"),
        ("broken.tar.gz", b"\x1f\x8b not really", 422, "not a readable .tar.gz"),
        ("empty.zip", zipped({}), 422, "holds no files"),
        ("twice.tar.gz", tarred({"a.py": b"1", "./a.py": b"2"}), 422, "appears twice"),
    ],
)
def test_a_bad_bundle_is_refused_with_its_cause_and_nothing_is_stored(
    alice: Api, settings: Settings, name: str, data: bytes, status: int, cause: str
) -> None:
    response = upload(alice, name, data)
    assert response.status_code == status, response.text
    assert cause in str(response.json()["detail"]), response.text
    assert stored(settings) == []  # no bundle, no scratch folder left behind


def test_unknown_and_malformed_bundle_ids(alice: Api) -> None:
    assert alice.get(f"/api/code/{'0' * 64}").status_code == 404
    assert alice.get("/api/code/not-an-id").status_code == 422
    assert alice.client.post("/api/code", files={"file": ("net.py", NET)}).status_code == 401


def test_a_job_names_its_bundle_and_the_bundle_must_hold_its_module(alice: Api) -> None:
    bundle = upload(alice, "lab.tar.gz", tarred({"lab/__init__.py": b"", "lab/nets.py": NET})).json()["id"]
    spec = {"model": "lab.nets:build", "dataset": "digits", "gpus": [0], "code": bundle}
    created = alice.post("/api/jobs", json=spec)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["code"] == bundle  # kept, so a clone or resubmit runs the same code

    def refused(change: dict, field: str, message: str) -> None:
        response = alice.post("/api/jobs", json={**spec, **change})
        assert response.status_code == 422, response.text
        assert any(message in d["msg"] and d["loc"][-1] == field for d in response.json()["detail"]), response.text

    refused({"code": "f" * 64}, "code", "no code bundle")
    refused({"code": "xyz"}, "code", "not a code bundle's id (64 hex digits, as POST /api/code or towerq run gives it)")
    refused(
        {"model": "lab.missing:build"},
        "model",
        "has no lab/missing.py (its Python files: lab/__init__.py, lab/nets.py)",
    )
    refused({"model": "mlp"}, "body", "with code, model names a function in the bundle")
    refused({"model": "lab.nets:biuld"}, "model", "lab/nets.py has no function 'biuld' (did you mean 'build'?)")
    broken = upload(alice, "bad.py", b"def build(params)\n    return None\n").json()["id"]
    refused({"model": "bad:build", "code": broken}, "model", "bad.py does not parse: line 1: expected ':'")


def test_a_package_module_counts(alice: Api) -> None:
    bundle = upload(alice, "pkg.zip", zipped({"pkg/__init__.py": NET})).json()["id"]
    spec = {"model": "pkg:build", "dataset": "digits", "gpus": [0], "code": bundle}
    assert alice.post("/api/jobs", json=spec).status_code == 201


def test_scratch_folders_never_outlive_an_upload(alice: Api, settings: Settings, tmp_path: Path) -> None:
    upload(alice, "net.py", NET)
    upload(alice, "slip.zip", zipped({"../x.py": b""}))
    assert not [name for name in stored(settings) if name.startswith(".")]
