"""The scheduling pass's cost in CPU instructions, this checkout against another revision.

Timings on a shared machine drift by 2x from minute to minute (CPU time included), which hides
a 30 % change in the pass; instructions counted by valgrind (`cachegrind`, no cache model) do
not drift. Each scenario runs in its own process under valgrind once with one pass and once
with three; half the difference is one pass, without start-up and the trace's reading (the
garbage collector off: a full collection walks the bench's own objects, not the pass's work).

Scenarios (every job of the Philly sample queued, 32 hosts x 8 GPUs all held):
`trace`: `bench/scheduler_trace.py`'s pass (1-GPU jobs, time slicing on); `rigid`, `elastic`:
`bench/elastic.py`'s (8-GPU jobs; elastic: they and the queued jobs may resize); each without
and with every waiting job's reason (`explain`).

Usage: `python bench/pass_instructions.py [--against REV]` (default HEAD; needs valgrind;
about 5 min on 2 cores). Prints M instructions per pass for both and their ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("trace", "rigid", "elastic")

ONE_RUN = """
import gc
import sys
sys.path.insert(0, sys.argv[1])
import bench.elastic as be
import bench.scheduler_trace as st
from service.scheduler.trace import read_trace
from service.scheduler.types import PolicyConfig

scenario, explain, passes = sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
gc.disable()  # the pass's own work: no collection, which both sides would time differently
jobs = read_trace(st.TRACE)
if scenario == "trace":
    st.pass_time(jobs, explain, repeats=passes, config=PolicyConfig(demote_after_gpu_s=st.SLICE_GPU_S))
else:
    config = be.PolicyConfig
    be.PolicyConfig = lambda **kw: config(explain=explain, **kw)
    timed = getattr(be, "pass_times", None) or be.pass_ms  # (pass_ms before 2026-12-02)
    timed(jobs, scenario == "elastic", repeats=passes)
"""


def instructions(tree: Path, scenario: str, explain: bool, passes: int) -> int:
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    command += [sys.executable, "-c", ONE_RUN, str(tree), scenario, "1" if explain else "0", str(passes)]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    for line in run.stderr.splitlines():
        if "I" in line and "refs:" in line:
            return int(line.split("refs:")[1].replace(",", "").strip())
    raise RuntimeError(f"no instruction count in valgrind's output:\n{run.stderr[-2000:]}")


def per_pass(tree: Path, scenario: str, explain: bool) -> float:
    """Millions of instructions in one pass."""
    return (instructions(tree, scenario, explain, 3) - instructions(tree, scenario, explain, 1)) / 2 / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--against", default="HEAD", help="the revision to compare with (default HEAD)")
    args = parser.parse_args()
    # Beside this checkout, as the benches find the trace: ../shared from the repository.
    other = ROOT.parent / f".pass-instructions-{os.getpid()}"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), args.against], cwd=ROOT, check=True)
    try:
        print(f"{'scenario':<22}{args.against + ' (M)':>16}{'this tree (M)':>16}{'ratio':>8}")
        for scenario in SCENARIOS:
            for explain in (False, True):
                before, after = per_pass(other, scenario, explain), per_pass(ROOT, scenario, explain)
                name = f"{scenario}{' + reasons' if explain else ''}"
                print(f"{name:<22}{before:>16.0f}{after:>16.0f}{after / before:>8.3f}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
