"""A command job's working folder (`worker.workdir`): a copy of its code bundle it may write
in, copied again at each attempt over what the program left there (its code as sent, its
other files kept), and its command run there."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack import REPO
from worker.workdir import NOT_RUN, copy_bundle


def bundle(tmp_path: Path) -> Path:
    code = tmp_path / "bundle"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print('train')\n")
    (code / "pkg" / "model.py").write_text("LAYERS = 2\n")
    (code / "run.sh").write_text('#!/bin/sh\necho ran in "$PWD"\n')
    (code / "run.sh").chmod(0o755)
    for path in (code / "train.py", code / "pkg" / "model.py"):
        path.chmod(0o444)  # a bundle's files are read only
    return code


def test_the_bundle_is_copied_writable_and_again_over_what_the_program_left(tmp_path: Path) -> None:
    code, work = bundle(tmp_path), tmp_path / "job" / "work"
    work.parent.mkdir()
    copy_bundle(code, work)
    assert (work / "pkg" / "model.py").read_text() == "LAYERS = 2\n"
    assert os.access(work / "run.sh", os.X_OK) and stat.S_IMODE((work / "train.py").stat().st_mode) & stat.S_IWUSR
    # what an attempt did: its own files, a file of its code changed, a link and a folder in
    # the places of two others
    (work / "runs").mkdir()
    (work / "runs" / "events").write_text("kept")
    (work / "train.py").write_text("changed")
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    (work / "pkg" / "model.py").unlink()
    (work / "pkg" / "model.py").symlink_to(outside)
    (work / "run.sh").unlink()
    (work / "run.sh").mkdir()
    copy_bundle(code, work)
    assert (work / "runs" / "events").read_text() == "kept"
    assert (work / "train.py").read_text() == "print('train')\n"
    assert not (work / "pkg" / "model.py").is_symlink() and (work / "pkg" / "model.py").read_text() == "LAYERS = 2\n"
    assert outside.read_text() == "untouched", "the link was replaced, not written through"
    assert (work / "run.sh").is_file() and os.access(work / "run.sh", os.X_OK)


def test_a_link_in_the_working_folders_place_is_not_followed(tmp_path: Path) -> None:
    code, elsewhere = bundle(tmp_path), tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "work").symlink_to(elsewhere)
    with pytest.raises(SystemExit, match="is a link"):
        copy_bundle(code, tmp_path / "work")
    assert list(elsewhere.iterdir()) == []


def launch(code: Path, work: Path, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "worker.workdir", str(code), str(work), "--", *command]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_the_command_runs_in_the_working_folder_or_says_why_it_cannot(tmp_path: Path) -> None:
    code, work = bundle(tmp_path), tmp_path / "work"
    ran = launch(code, work, "./run.sh")
    assert ran.returncode == 0 and ran.stdout == f"ran in {work}\n", ran
    missing = launch(code, work, "./nothing.sh")
    assert missing.returncode == NOT_RUN
    assert missing.stderr == (
        "towerq: cannot run './nothing.sh': No such file or directory "
        "(no such file in the job's code, nor a program on the worker's PATH)\n"
    )
    (code / "train.py").chmod(0o644)
    refused = launch(code, work, "./train.py")  # not packed executable
    assert refused.returncode == NOT_RUN and "runs only if packed executable" in refused.stderr, refused


def test_towerqs_folders_lead_a_programs_pythonpath_and_its_own_follow(tmp_path: Path) -> None:
    """Its `env`'s PYTHONPATH replaced towerq's: `import towerq` failed. Now towerq's
    `program_site` (each line written whole) and its code come first, the job's own after."""
    from service.core.settings import Settings
    from worker.launch import REPO_ROOT, Launch
    from worker.program import PROGRAM_SITE, program_environment

    spec = {"command": ["python", "train.py"], "code": "x" * 64, "env": {"PYTHONPATH": "/job/work/src"}}
    launch = Launch(7, 1, "lab-a", [0], 1.0, spec, None, [16_384], True)
    env = program_environment(launch, Settings(artifacts_dir=tmp_path), Path("/job"), True)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PROGRAM_SITE), str(REPO_ROOT), "/job/work/src"]
    probe = "import sys, towerq; print(type(sys.stdout.buffer).__name__, sys.stdout.line_buffering)"
    ran = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True)
    assert ran.stdout == "BufferedWriter True\n", ran
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "sitecustomize.py").write_text("print('the lab sets up its own too')")
    env["PYTHONPATH"] += os.pathsep + str(lab)
    ran = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **env}, capture_output=True, text=True)
    assert ran.stdout == "the lab sets up its own too\nBufferedWriter True\n", ran
