"""Refuse to set up on a Python older than 3.11, saying what to do instead."""

import sys

if sys.version_info < (3, 11):
    sys.exit(f"towerq needs Python 3.11 or newer; this is {sys.version.split()[0]}. Run `make PYTHON=python3.11 ...`.")
