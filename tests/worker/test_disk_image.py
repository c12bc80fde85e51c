"""Bringing a job's folder back from its disk image (`worker.disk_image.copy_back`): the copy
takes the folder's place in one step, so the API never finds a job's folder missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from worker import disk_image
from worker.disk_image import put_in_place

WATCH = """
import os, sys
folder, stop = sys.argv[1], sys.argv[2]
print("ready", flush=True)
missed = looked = 0
while True:
    looked += 1
    if not os.path.isdir(folder):
        missed += 1
    if looked % 1000 == 0 and os.path.exists(stop):
        break
print(missed, looked, flush=True)
"""


def swaps_seen_missing(tmp_path: Path, swaps: int) -> tuple[int, int]:
    """`swaps` new folders put in place of the job's while another process looks at it
    without pause: (times it found no folder, times it looked)."""
    folder, stop = tmp_path / "job", tmp_path / "stop"
    folder.mkdir()
    watcher = subprocess.Popen([sys.executable, "-c", WATCH, str(folder), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert watcher.stdout is not None and watcher.stdout.readline().strip() == "ready"
        for i in range(swaps):
            new = tmp_path / ".job.back"
            new.mkdir()
            (new / "step").write_text(str(i))
            put_in_place(new, folder, tmp_path / ".job.old")
        stop.touch()
        missed, looked = map(int, watcher.communicate(timeout=30)[0].split())
    finally:
        watcher.kill()
        watcher.wait()
    assert (folder / "step").read_text() == str(swaps - 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "stop"], "nothing left beside it"
    return missed, looked


def test_the_folder_brought_back_takes_its_place_in_one_step(tmp_path: Path) -> None:
    missed, looked = swaps_seen_missing(tmp_path, 300)
    assert looked > 300 and missed == 0


def test_where_the_filesystem_cannot_exchange_it_moves_the_old_folder_aside_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS has no atomic exchange: the folder is still replaced, with a moment without it."""
    monkeypatch.setattr(disk_image, "exchange", lambda a, b: False)
    swaps_seen_missing(tmp_path, 20)
