"""A trainer's start: what loading TensorFlow and Keras costs with scikit-learn hidden from
Keras (`worker.trainer.frameworks`) against Keras importing it, as it does where it is
installed.

Both sides are the real warm trainer (`python -m worker.trainer --warm 0`), timed from its
start to its `warm` line (TensorFlow, Keras and the trainer imported): the control imports
scikit-learn first, so `frameworks.load` leaves it visible and Keras loads its wrappers as
it would without towerq. Measured per start: the wall time and the CPU time of the process
(user + system, from `wait4`). The starts are interleaved, so drift hits both alike; medians.

Usage: `python bench/trainer_start.py [--repeats 7]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTROL = (
    "import sklearn, runpy, sys; sys.argv[1:] = ['--warm', '0']; "
    "runpy.run_module('worker.trainer', run_name='__main__')"
)


def start(command: list[str]) -> tuple[float, float]:
    """(wall s to the `warm` line, CPU s of the whole process) of one warm trainer."""
    began = time.monotonic()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryFile() as said:  # TensorFlow's start-up lines, shown only on a failure
        trainer = subprocess.Popen(
            command, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=said
        )
        assert trainer.stdout is not None and trainer.stdin is not None
        line = trainer.stdout.readline()
        wall = time.monotonic() - began
        if b'"event": "warm"' not in line:
            trainer.kill()
            trainer.wait()
            said.seek(0)
            raise RuntimeError(f"no warm line: {line[:300]!r}; stderr: {said.read()[-2000:]!r}")
    trainer.stdin.close()  # the pool closing: it ends
    _, status, usage = os.wait4(trainer.pid, 0)
    trainer.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    sides = {
        "scikit-learn hidden (towerq)": [sys.executable, "-m", "worker.trainer", "--warm", "0"],
        "Keras imports it (control)": [sys.executable, "-c", CONTROL],
    }
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, command in sides.items():
            figures[name].append(start(command))
    cores = len(os.sched_getaffinity(0))
    print(f"warm trainer start to its warm line, {cores} cores; median of {args.repeats} interleaved starts")
    medians = {}
    for name, values in figures.items():
        wall, cpu = (statistics.median(side) for side in zip(*values, strict=True))
        medians[name] = (wall, cpu)
        print(f"  {name:<30} {wall:6.2f} s wall  {cpu:6.2f} s CPU")
    (hidden_wall, hidden_cpu), (control_wall, control_cpu) = medians.values()
    print(f"  hidden / control: wall {hidden_wall / control_wall:.3f}, CPU {hidden_cpu / control_cpu:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
