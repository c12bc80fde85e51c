"""What a job folder's disk image (`worker/disk.py`, `TOWERQ_JOB_DISK`) costs an attempt.

Each attempt on an image makes it (`mkfs.ext4`), copies the job's folder in, mounts it over
the folder, and at the end copies the folder back and removes the image. For a folder of
each size (random bytes in one file, as a checkpoint; 0: a new job's empty folder), in one
run, interleaved `--repeats` times so that drift hits both alike:

- `open` and `close` of a `JobDisk` on that folder (the attempt's start and end);
- a restart (a preempted or resized job): the attempt's close keeping the image, and the
  next attempt's hold taking it as it is (no copy either way), against what a restart
  would cost with copies (close + open);
- the control: one plain copy of the same folder (`shutil.copytree`, onto the same disk),
  the least any copy in or out could cost.

Printed: the medians, the attempt's whole overhead (open + close) as a ratio to the plain
copy, and a restart's on the kept image as a ratio to open + close. Needs root (loop mounts).

Usage: `sudo python bench/job_disk.py [--sizes-mb 0,100,1000] [--repeats 3] [--dir /var/tmp]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import disk, disk_kind  # noqa: E402
from worker.folder import JOB_FOLDER_MAX_ENTRIES  # noqa: E402


def one_round(root: Path, size_mb: int) -> tuple[float, float, float, float]:
    """(open s, close s, plain copy s, restart on the kept image s) for a folder of `size_mb`."""
    folder = root / "artifacts" / "job-1"
    folder.mkdir(parents=True)
    if size_mb:
        with open(folder / "checkpoint.bin", "wb") as out:
            for _ in range(size_mb):
                out.write(os.urandom(2**20))
    os.sync()
    started = time.perf_counter()
    shutil.copytree(folder, root / "plain")
    os.sync()
    plain = time.perf_counter() - started
    disks = root / "var" / disk.DISKS
    capacity = max(2 * size_mb * 2**20, 64 * 2**20)
    started = time.perf_counter()
    held = disk.JobDisk.hold(folder, disks, (1, 1))
    held.fill(capacity, JOB_FOLDER_MAX_ENTRIES)
    opened = time.perf_counter() - started
    started = time.perf_counter()
    held.close(keep=True)
    held = disk.JobDisk.hold(folder, disks, (1, 2), lambda job, attempt: disk.WAITS, size=capacity)
    restarted = time.perf_counter() - started
    assert held.settled == disk.KEPT, held.settled
    started = time.perf_counter()
    held.close()
    os.sync()
    closed = time.perf_counter() - started
    return opened, closed, plain, restarted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="0,100,1000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    args = parser.parse_args()
    why = disk_kind.images_work(args.dir.resolve())
    if why is not None:
        print(f"no disk images here: {why}", file=sys.stderr)
        return 1
    sizes = [int(size) for size in args.sizes_mb.split(",")]
    times: dict[int, list[tuple[float, float, float, float]]] = {size: [] for size in sizes}
    for _ in range(args.repeats):
        for size in sizes:
            with tempfile.TemporaryDirectory(dir=args.dir, prefix="towerq-disk-bench-") as name:
                times[size].append(one_round(Path(name), size))
    print(
        f"{'folder':>8} {'open':>9} {'close':>9} {'plain copy':>11} {'(open+close) / copy':>20}"
        f" {'restart kept':>13} {'kept / (open+close)':>20}"
    )
    for size, rounds in times.items():
        opened, closed, plain, restarted = (statistics.median(column) for column in zip(*rounds, strict=True))
        ratio = f"{(opened + closed) / plain:19.2f}x" if size else f"{'-':>20}"  # nothing to copy: no ratio
        label = f"{size} MB" if size else "empty"
        print(
            f"{label:>8} {opened * 1000:7.0f}ms {closed * 1000:7.0f}ms {plain * 1000:9.0f}ms {ratio}"
            f" {restarted * 1000:11.1f}ms {restarted / (opened + closed):19.3f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
