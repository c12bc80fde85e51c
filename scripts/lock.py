#!/usr/bin/env python3
"""The exact versions towerq's setup installs: `constraints.txt`, written from a tested
virtual environment, read by `make setup` and the Dockerfile (`pip install -c`).

pyproject.toml gives ranges (what towerq works with); the constraints give the one version of
every package in their closure that the test suite passed with, so that a fresh machine
installs what CI tested, not whatever came out since (redis-py 8.2 once changed how a
thread stops, and a worker's stop waited a minute now and then: docs/reliability.md).

    .venv/bin/python scripts/lock.py          # write constraints.txt from .venv (`make lock`)
    .venv/bin/python scripts/lock.py --check  # exit 1 naming each package that differs

The closure is towerq's requirements for the extras the setup installs (`LOCKED_EXTRAS`),
followed through each package's own requirements and the extras they ask for, markers
evaluated for this Python. `make lock` upgrades the environment to the newest versions
pyproject.toml allows and runs this; then `make test`, and commit the file if it passes. An
unchanged file is left untouched: `make setup` reinstalls when it changes.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"
LOCKED_EXTRAS = ["server", "cpu", "notebook", "dev"]
"""The extras `make setup` installs (the Makefile's `EXTRAS`): everything CI runs."""
SAME_VERSION_AS = {"tensorflow": "tensorflow-cpu"}
"""Packages of an extra the setup does not install (`gpu`), pinned to the version of their
tested twin: the GPU build of TensorFlow is the same release as the CPU build CI runs."""
HEADER = """\
# The versions the test suite passed with, for `pip install -c` (make setup, the Dockerfile).
# Written by scripts/lock.py from a tested environment (Python {python}); do not edit by hand:
# `make lock` (the newest versions pyproject.toml allows), then `make test`, and commit.
"""


class NotInstalled(Exception):
    """A requirement of the closure is missing from the environment being locked."""


def wanted(requirement: Requirement, extras: set[str]) -> bool:
    """Whether a requirement applies here, for a package installed with these extras."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""}))  # and this Python


def closure(roots: list[Requirement]) -> dict[str, metadata.Distribution]:
    """Every installed package the requirements `roots` need (theirs too, with the extras
    asked for), by canonical name."""
    found: dict[str, metadata.Distribution] = {}
    asked: dict[str, set[str]] = {}
    pending = list(roots)
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        extras = {canonicalize_name(e) for e in requirement.extras}
        if name in found and extras <= asked[name]:
            continue
        try:
            found[name] = distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise NotInstalled(f"{requirement.name} is not installed") from None
        asked[name] = asked.get(name, set()) | extras
        pending += [needed for needed in map(Requirement, distribution.requires or []) if wanted(needed, asked[name])]
    return found


def towerq_requirements(extras: list[str]) -> list[Requirement]:
    """pyproject.toml's requirements for these extras (scripts/requirements.py, a sibling
    script rather than a package, so loaded from its file)."""
    spec = importlib.util.spec_from_file_location("requirements", Path(__file__).with_name("requirements.py"))
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return [Requirement(line) for line in script.requirements(extras)]


def locked_versions() -> dict[str, str]:
    """What constraints.txt should say for this environment."""
    found = closure(towerq_requirements(LOCKED_EXTRAS))
    pinned = {name: distribution.version for name, distribution in found.items() if name != "towerq"}
    for package, twin in SAME_VERSION_AS.items():
        pinned[package] = pinned[twin]
    return dict(sorted(pinned.items()))


def render(pinned: dict[str, str]) -> str:
    python = ".".join(str(part) for part in sys.version_info[:2])
    return HEADER.format(python=python) + "".join(f"{name}=={version}\n" for name, version in pinned.items())


def read(path: Path = CONSTRAINTS) -> dict[str, str]:
    """The pins of a constraints file, by canonical name."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def differences(locked: dict[str, str], written: dict[str, str]) -> list[str]:
    """One line per package whose pin is not what the environment has."""
    lines = []
    for name in sorted(locked.keys() | written.keys()):
        have, pin = locked.get(name), written.get(name)
        if have != pin:
            lines.append(f"{name}: installed {have or 'not needed'}, constraints.txt {pin or 'missing'}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write; exit 1 when they differ")
    parser.add_argument("--constraints", type=Path, default=CONSTRAINTS, help="the file (default: the repository's)")
    args = parser.parse_args()
    try:
        locked = locked_versions()
    except NotInstalled as missing:
        extras = ", ".join(LOCKED_EXTRAS)
        print(f"lock.py: {missing} (towerq's {extras} need it); run `make setup` first", file=sys.stderr)
        return 2
    if not args.check:
        text = render(locked)
        if args.constraints.exists() and args.constraints.read_text() == text:
            print(f"{args.constraints}: unchanged ({len(locked)} pins)")  # and not touched: make setup keys on it
            return 0
        args.constraints.write_text(text)
        print(f"wrote {len(locked)} pins to {args.constraints}")
        return 0
    lines = differences(locked, read(args.constraints))
    for line in lines:
        print(line)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
