"""Loaded by every Python process of a command job (this folder leads its `PYTHONPATH`,
`worker.program.program_environment`): stdout and stderr write each line whole, as on a
terminal.

towerq runs programs with `PYTHONUNBUFFERED=1` so that what they print comes as it is
printed; but an unbuffered `print` writes its text and its newline apart, and processes that
share the job's output (torchrun's ranks, a DataLoader's workers, `multiprocessing`) wrote
into each other's lines (`rank 0 of 2rank 1 of 2`, then two empty lines). Line-buffered, a
line is one write (a pipe keeps a write of up to 4 KiB whole), and it still comes as soon as
it ends; a carriage return flushes too (a progress bar's redraw). Where this is not loaded
(`python -I`, `-S`), `PYTHONUNBUFFERED` still holds. A lab's own `sitecustomize`, if any,
is loaded after this one. Standard library only: it runs in the sandbox."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import os
import sys
from typing import TextIO


def _whole_lines(stream: TextIO | None) -> TextIO | None:
    """`stream` writing through a line buffer (a terminal's stream, or one that is no file,
    as it is)."""
    if stream is None:
        return None
    try:
        if stream.isatty():
            return stream
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return stream
    buffered = io.BufferedWriter(io.FileIO(fd, "w", closefd=False))
    return io.TextIOWrapper(buffered, encoding=stream.encoding, errors=stream.errors, line_buffering=True)


def _next_sitecustomize() -> None:
    """Run the `sitecustomize` that this one hides on `sys.path`, where there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_ORIGINAL = (sys.stdout, sys.stderr)  # kept: their file descriptors stay open either way
sys.stdout = sys.__stdout__ = _whole_lines(sys.stdout)  # type: ignore[misc,assignment]
sys.stderr = sys.__stderr__ = _whole_lines(sys.stderr)  # type: ignore[misc,assignment]
_next_sitecustomize()
