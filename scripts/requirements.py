#!/usr/bin/env python3
"""Print towerq's requirements from pyproject.toml, one per line: the base dependencies (the
client's) and those of each extra named (`server`, `cpu`, `gpu`, `notebook`, `dev`); an extra
that names towerq's own (`towerq[server]`) brings that one's requirements, not towerq itself.

The Dockerfile installs them in a layer of their own, before the code is copied, so that an
edit to the code does not reinstall TensorFlow. Standard library only (it runs before any
dependency is installed).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
OWN = re.compile(r"towerq\[([a-z,-]+)\]")
"""An extra that brings other extras of towerq's own."""


def requirements(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"requirements.py: no extra {', '.join(unknown)} (there are: {', '.join(optional)})")
    lines, pending, seen = list(project["dependencies"]), list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            own = OWN.fullmatch(line.replace(" ", ""))
            if own:
                pending += own.group(1).split(",")
            elif line not in lines:
                lines.append(line)
    return lines


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
