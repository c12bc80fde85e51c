"""constraints.txt pins the versions the suite passed with (scripts/lock.py): `make setup` and
the Dockerfile install those, so a fresh machine gets what CI tested. These tests run in the
suite's own environment, so they fail when it no longer matches the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from tests.stack import REPO, load_script

lock = load_script("lock.py")


def test_the_constraints_pin_every_package_of_the_environment_the_suite_runs_in() -> None:
    differ = lock.differences(lock.locked_versions(), lock.read())
    told = "the environment is not constraints.txt's: `make setup`, or relock (scripts/lock.py)"
    assert not differ, told + ":\n" + "\n".join(differ)


def test_every_pin_is_within_pyproject_ranges_the_gpu_build_included() -> None:
    pins = lock.read()
    every = lock.towerq_requirements(["server", "cpu", "gpu", "notebook", "dev"])
    outside = [f"{r}: {pins[r.name]}" for r in every if r.name in pins and not r.specifier.contains(pins[r.name])]
    assert not outside
    # the GPU build of TensorFlow, which CI never installs, is the CPU build's release
    assert pins["tensorflow"] == pins["tensorflow-cpu"]
    assert "towerq" not in pins and "torch" not in pins  # torch: `make frameworks` names its own


def test_a_requirement_counts_only_where_its_marker_holds() -> None:
    standard = Requirement('websockets>=10.4; extra == "standard"')
    assert lock.wanted(standard, {"standard"}) and not lock.wanted(standard, set())
    assert not lock.wanted(Requirement('tomli>=1.1; python_version < "3.11"'), set())
    assert lock.wanted(Requirement("click>=8"), set())
    # uvicorn[standard] brings its extra's packages into the closure, plain uvicorn does not
    assert "uvloop" in lock.closure([Requirement("uvicorn[standard]")])
    assert "uvloop" not in lock.closure([Requirement("uvicorn")])


def test_the_check_names_each_package_that_differs_and_fails(tmp_path: Path) -> None:
    pins = lock.read()
    pins["redis"] = "8.1.0"
    del pins["rq"]
    pins["left-over"] = "1.0"
    changed = tmp_path / "constraints.txt"
    changed.write_text("".join(f"{name}=={version}  # a comment\n" for name, version in pins.items()))
    script = [sys.executable, str(REPO / "scripts" / "lock.py"), "--check", "--constraints", str(changed)]
    checked = subprocess.run(script, capture_output=True, text=True)
    assert checked.returncode == 1, checked.stderr
    installed = lock.locked_versions()
    assert checked.stdout.splitlines() == [
        "left-over: installed not needed, constraints.txt 1.0",
        f"redis: installed {installed['redis']}, constraints.txt 8.1.0",
        f"rq: installed {installed['rq']}, constraints.txt missing",
    ]
    agreed = subprocess.run(script[:-1] + [str(REPO / "constraints.txt")], capture_output=True, text=True)
    assert agreed.returncode == 0 and agreed.stdout == "", agreed.stdout


def test_make_setup_installs_the_pinned_versions_and_reinstalls_when_they_change() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "$(STAMP): pyproject.toml constraints.txt\n" in makefile
    installs = [line for line in makefile.splitlines() if "/pip install" in line and "--upgrade" not in line]
    assert len(installs) == 2 and all("-c constraints.txt" in line for line in installs), installs
    # the extras installed are those pinned, and the relock below installs the same
    assert f"\nEXTRAS := {','.join(lock.LOCKED_EXTRAS)}\n" in makefile
    assert makefile.count("-e '.[$(EXTRAS)]'") == 2
    # only `make lock` goes past the pins, on purpose, and writes the new ones at once; not
    # through setup, whose constrained install fails where a pin no longer can
    assert "\nlock:\n" in makefile
    (relock,) = [line for line in makefile.splitlines() if "--upgrade-strategy eager" in line]
    following = makefile.split(relock, 1)[1].splitlines()[1]
    assert following.strip() == "$(BIN)/python scripts/lock.py"


def test_writing_the_same_pins_leaves_the_file_untouched_and_new_ones_rewrite_it(tmp_path: Path) -> None:
    """`make setup` reinstalls when constraints.txt is newer than its stamp: a relock that
    changes nothing must not make every later setup reinstall."""
    target = tmp_path / "constraints.txt"
    target.write_text((REPO / "constraints.txt").read_text())
    before = target.stat().st_mtime_ns
    script = [sys.executable, str(REPO / "scripts" / "lock.py"), "--constraints", str(target)]
    same = subprocess.run(script, capture_output=True, text=True)
    assert same.returncode == 0 and "unchanged" in same.stdout, same.stdout + same.stderr
    assert target.stat().st_mtime_ns == before
    target.write_text("redis==8.1.0\n")
    changed = subprocess.run(script, capture_output=True, text=True)
    assert changed.returncode == 0 and "wrote" in changed.stdout, changed.stdout + changed.stderr
    assert target.read_text() == (REPO / "constraints.txt").read_text()
