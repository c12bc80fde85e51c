"""Dataset uploads over the API: stored under the owner's folder, private to them (listings,
the catalog, and job specs), within a quota, refused with the cause named and nothing
stored; deleted by their owner only."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable

import numpy as np
import pytest

from service.core.settings import Settings
from tests.service.api.conftest import Api


@pytest.fixture
def settings(make_settings: Callable[..., Settings], database_url: str) -> Settings:
    return make_settings(database_url, user_data_quota_bytes=200_000, max_dataset_files=50)


@pytest.fixture
def bob(as_user: Callable[..., Api], alice: Api) -> Api:
    return as_user("bob")


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


CELLS = npz_bytes(x=np.random.default_rng(0).random((40, 4, 4), dtype=np.float32), y=np.arange(40) % 2)


def upload(api: Api, name: str, filename: str, data: bytes):
    return api.post("/api/datasets", data={"name": name}, files={"file": (filename, data)})


def images_zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_an_upload_is_its_owners_alone(alice: Api, bob: Api, settings: Settings) -> None:
    created = upload(alice, "cells", "cells.npz", CELLS)
    assert created.status_code == 201, created.text
    described = created.json()
    assert described == {
        "name": "cells",
        "owner": "alice",
        "kind": "npz",
        "dataset": "npz:users/alice/cells/data.npz",
        "size": len(CELLS),
        "shared": False,
    }
    assert (settings.data_dir / "users/alice/cells/data.npz").read_bytes() == CELLS
    np.savez(settings.data_dir / "lab-shared.npz", x=np.zeros((4, 2)), y=np.zeros(4))

    mine = alice.get("/api/datasets").json()
    assert [(d["name"], d["owner"]) for d in mine["items"]] == [("cells", "alice"), ("lab-shared.npz", "lab")]
    assert mine["items"][1]["size"] == (settings.data_dir / "lab-shared.npz").stat().st_size
    assert mine["used_bytes"] == len(CELLS) and mine["quota_bytes"] == 200_000
    theirs = bob.get("/api/datasets").json()
    assert [d["owner"] for d in theirs["items"]] == ["lab"] and theirs["used_bytes"] == 0

    in_catalog = [d["name"] for d in alice.get("/api/catalog").json()["datasets"]]
    assert "npz:users/alice/cells/data.npz" in in_catalog and "npz:lab-shared.npz" in in_catalog
    assert "npz:users/alice/cells/data.npz" not in [d["name"] for d in bob.get("/api/catalog").json()["datasets"]]

    spec = {"model": "mlp", "dataset": "npz:users/alice/cells/data.npz", "gpus": [0]}
    assert alice.post("/api/jobs", json=spec).status_code == 201
    refused = bob.post("/api/jobs", json=spec)
    assert refused.status_code == 422
    assert "is alice's upload: only alice's jobs may use it" in refused.json()["detail"][0]["msg"]
    test_path = {
        **spec,
        "dataset": "npz:lab-shared.npz",
        "dataset_options": {"test_path": "users/alice/cells/data.npz"},
    }
    assert bob.post("/api/jobs", json=test_path).status_code == 422


def test_an_image_folder_zip_points_at_its_classes(alice: Api) -> None:
    zipped = images_zip({"flowers/roses/a.png": b"png", "flowers/tulips/b.png": b"png"})
    described = upload(alice, "flowers", "flowers.zip", zipped).json()
    assert described["kind"] == "images"
    assert described["dataset"] == "images:users/alice/flowers/images/flowers"


@pytest.mark.parametrize(
    ("name", "filename", "data", "status", "cause"),
    [
        ("bad name", "a.npz", CELLS, 422, "letters, digits"),
        ("notes", "notes.txt", b"hi", 422, "an .npz, a .tfrecord, or a .zip of an image folder"),
        ("arrays", "a.npz", npz_bytes(inputs=np.zeros(3)), 422, "must hold x, y"),
        ("broken", "b.npz", b"not a zip", 422, "not a readable .npz"),
        ("empty", "e.tfrecord", b"", 422, "the file is empty"),
        ("huge", "h.tfrecord", os.urandom(210_000), 413, "TOWERQ_USER_DATA_QUOTA_BYTES"),
        ("flat", "flat.zip", images_zip({"a.png": b"png"}), 422, "one sub-folder per class"),
        ("slip", "slip.zip", images_zip({"../../escape/a.png": b"png"}), 422, "must not contain '..'"),
        ("bomb", "bomb.zip", images_zip({"c/zeros.png": b"\0" * 5_000_000}), 413, "TOWERQ_USER_DATA_QUOTA_BYTES"),
        ("many", "many.zip", images_zip({f"c/{i}.png": b"" for i in range(51)}), 413, "TOWERQ_MAX_DATASET_FILES"),
    ],
)
def test_a_bad_upload_is_refused_with_its_cause_and_nothing_is_stored(
    alice: Api, settings: Settings, name: str, filename: str, data: bytes, status: int, cause: str
) -> None:
    response = upload(alice, name, filename, data)
    assert response.status_code == status, response.text
    assert cause in str(response.json()["detail"]), response.text
    folder = settings.data_dir / "users" / "alice"
    assert not folder.exists() or os.listdir(folder) == []


def test_the_quota_counts_what_is_stored(alice: Api) -> None:
    assert upload(alice, "one", "one.tfrecord", os.urandom(120_000)).status_code == 201
    over = upload(alice, "two", "two.tfrecord", os.urandom(120_000))
    assert over.status_code == 413 and "80000 bytes left" in str(over.json()["detail"])
    assert upload(alice, "one", "again.npz", CELLS).status_code == 409  # the name is taken


def test_only_the_owner_deletes(alice: Api, bob: Api, settings: Settings) -> None:
    upload(alice, "cells", "cells.npz", CELLS)
    assert bob.client.delete("/api/datasets/cells", headers=bob.headers).status_code == 404
    assert alice.client.delete("/api/datasets/cells", headers=alice.headers).status_code == 204
    assert not (settings.data_dir / "users/alice/cells").exists()
    assert alice.client.delete("/api/datasets/cells", headers=alice.headers).status_code == 404
    assert [d for d in alice.get("/api/datasets").json()["items"] if d["owner"] == "alice"] == []
