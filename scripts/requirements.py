#!/usr/bin/env python3
"""Print towerq's requirements from pyproject.toml, one per line: the base dependencies and
those of each extra named (`cpu`, `gpu`, `dev`).

The Dockerfile installs them in a layer of their own, before the code is copied, so that an
edit to the code does not reinstall TensorFlow. Standard library only (it runs before any
dependency is installed).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"requirements.py: no extra {', '.join(unknown)} (there are: {', '.join(optional)})")
    return [*project["dependencies"], *(line for extra in extras for line in optional[extra])]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
