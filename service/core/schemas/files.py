"""Uploads as the API shows them: code bundles and datasets."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class BundleFile(BaseModel):
    path: str
    size: int


class BundleOut(BaseModel):
    id: str
    files: list[BundleFile]
    size: int
    """Bytes unpacked."""


class DatasetOut(BaseModel):
    name: str
    owner: str
    """The user who uploaded it, or `lab` for shared data an admin placed in TOWERQ_DATA_DIR."""
    kind: Literal["npz", "tfrecord", "images"]
    dataset: str
    """What a job spec's `dataset` says to use it."""
    size: int | None = None
    shared: bool = False


class DatasetList(BaseModel):
    items: list[DatasetOut]
    used_bytes: int
    quota_bytes: int
