"""The environments a host keeps (`worker.pyenv.prune`): the most recently used, every one a
job holds or that is being built, and nothing an attempt killed early left for long."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from worker import pyenv


def made(root: Path, key: str, used: float) -> Path:
    folder = root / key
    folder.mkdir(parents=True)
    (folder / pyenv.READY).write_text("{}")
    os.utime(folder / pyenv.READY, (used, used))
    return folder


def test_prune_keeps_the_most_recent_and_every_held_or_building_one(tmp_path: Path) -> None:
    now = time.time()
    for age, key in enumerate(["new", "held", "building", "old", "older"]):
        made(tmp_path, key, now - 100 * (age + 1))
    with open(tmp_path / "held" / pyenv.READY) as held, open(tmp_path / "building.lock", "a") as building:
        fcntl.flock(held, fcntl.LOCK_SH)  # a job runs in it
        fcntl.flock(building, fcntl.LOCK_EX)  # its lock taken: another job works on it
        removed = pyenv.prune(tmp_path, 2, keep="this-one")
    assert sorted(removed) == ["old", "older"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["building", "held", "new"]


def test_prune_removes_what_a_killed_attempt_left_once_it_is_old(tmp_path: Path) -> None:
    stale, fresh = tmp_path / ".environ-1-2.json", tmp_path / ".environ-3-4.json"
    stale.write_text("{}")
    fresh.write_text("{}")
    folder = tmp_path / "pip-abc"
    folder.mkdir()
    old = time.time() - pyenv.LEFT_BEHIND_S - 10
    os.utime(stale, (old, old))
    os.utime(folder, (old, old))
    pyenv.prune(tmp_path, 20, keep="")
    assert not stale.exists() and not folder.exists() and fresh.exists()


def test_an_environments_key_is_its_list_whatever_the_order_and_the_labs_options(tmp_path: Path) -> None:
    assert pyenv.env_key(["b", "a==1"], "") == pyenv.env_key(["a==1", "b"], "")
    assert pyenv.env_key(["a==1"], "") != pyenv.env_key(["a==2"], "")
    assert pyenv.env_key(["a"], "") != pyenv.env_key(["a"], "--index-url https://pypi.lab/simple")


def test_the_options_that_carry_a_url_go_to_pips_file_and_the_rest_stay_on_its_command_line() -> None:
    words, lines = pyenv.split_options(
        "--no-cache-dir --index-url https://lab:pw@pypi.lab/simple --timeout 60 -i https://a:b@other/simple "
        "--extra-index-url=https://c:d@extra/simple -fhttps://e:f@wheels/ --find-links /srv/wheels --pre"
    )
    assert words == ["--no-cache-dir", "--timeout", "60", "--pre"]
    assert lines == [
        "--index-url https://lab:pw@pypi.lab/simple",
        "-i https://a:b@other/simple",
        "--extra-index-url https://c:d@extra/simple",
        "-f https://e:f@wheels/",
        "--find-links /srv/wheels",
    ]
    assert pyenv.split_options("--no-index --find-links /srv/wheels") == (["--no-index"], ["--find-links /srv/wheels"])
    assert pyenv.split_options("") == ([], [])


def test_a_version_no_one_has_is_told_with_the_versions_the_index_has() -> None:
    missing = "No matching distribution found for torch==2.9.9"
    assert pyenv.reason(missing, "1.0, 2.0") == f"{missing} (the index has 1.0, 2.0)"
    many = ", ".join(f"2.{minor}.0" for minor in range(12))
    assert (
        pyenv.reason(missing, many)
        == f"{missing} (the index has 12 versions: ..., {many[len('2.0.0, 2.1.0, 2.2.0, 2.3.0, ') :]})"
    )
    assert pyenv.reason(missing, "none") == f"{missing} (the index has no version of it, or could not be reached)"
    assert pyenv.reason(missing, None) == missing
    other = "Could not install packages due to an OSError: [Errno 28] No space left on device"
    assert pyenv.reason(other, "1.0") == other, "only where no version matched"
