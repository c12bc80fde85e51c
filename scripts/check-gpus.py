#!/usr/bin/env python3
"""Check this host's GPUs the way a towerq worker sees them (NVML), on a real GPU host.

Prints the inventory (index, UUID, name, memory, utilization, processes), then, with
`--probe`, starts a process that takes GPU memory on one GPU exactly as a trainer would
(`CUDA_VISIBLE_DEVICES=<index>`, `CUDA_DEVICE_ORDER=PCI_BUS_ID`, its own session), and
checks what the worker relies on:

- the probe's pid appears in NVML's process list of that GPU (the worker holds a GPU
  until its trainer's pid is gone from that list);
- the memory it took shows in NVML's used memory;
- after SIGKILL of its process group, the pid leaves the list and the memory comes back;
- the per-process memory limit towerq would give a trainer with fraction 0.25.

Needs only `nvidia-ml-py`, plus PyTorch, CuPy or TensorFlow for the probe. Prints one JSON
object; exits non-zero when a check fails. Usage: `python scripts/check-gpus.py [--probe]
[--index 0] [--mb 1024]`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.inventory import NvmlInventory, open_nvml  # noqa: E402

PROBE = r"""
import sys, time
mb = int(sys.argv[1])
try:
    import torch
    block = torch.empty(mb * 2**20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    framework = "torch " + torch.__version__
except ImportError:
    try:
        import cupy
        block = cupy.empty(mb * 2**20, dtype=cupy.uint8)
        framework = "cupy " + cupy.__version__
    except ImportError:
        import tensorflow as tf
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        with tf.device("/GPU:0"):
            block = tf.zeros([mb * 2**20], dtype=tf.uint8)
        framework = "tensorflow " + tf.__version__
print("ready", framework, flush=True)
time.sleep(600)
"""


def wait(predicate, timeout: float, step: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def probe(inventory: NvmlInventory, index: int, mb: int) -> dict[str, object]:
    before = inventory.refresh()[index]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    child = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(mb)], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert child.stdout is not None
    ready = child.stdout.readline().strip()
    result: dict[str, object] = {"probe_pid": child.pid, "probe": ready, "memory_used_before_mb": before.memory_used_mb}
    started = time.monotonic()
    listed = wait(lambda: child.pid in inventory.pids_on([index]), 10)
    during = inventory.refresh()[index]
    result.update(
        pid_listed=bool(listed),
        pid_listed_after_s=round(time.monotonic() - started, 2),
        processes_during=during.processes,
        memory_used_during_mb=during.memory_used_mb,
        memory_taken_mb=during.memory_used_mb - before.memory_used_mb,
        # What the process costs beyond its tensor: its CUDA context and allocator
        # (TOWERQ_GPU_PROCESS_OVERHEAD_MB); memory_used_before_mb on an idle card is
        # TOWERQ_GPU_MEMORY_RESERVED_MB.
        process_overhead_mb=during.memory_used_mb - before.memory_used_mb - mb,
        other_gpus_untouched=all(
            child.pid not in {p["pid"] for p in g.processes} for g in inventory.refresh() if g.index != index
        ),
    )
    killed = time.monotonic()
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    gone = wait(lambda: child.pid not in inventory.pids_on([index]), 30)
    after = wait(lambda: (g := inventory.refresh()[index]).memory_used_mb <= before.memory_used_mb + 64 and g, 30)
    final = after or inventory.refresh()[index]
    result.update(
        pid_gone_after_kill=bool(gone),
        pid_gone_after_s=round(time.monotonic() - killed, 2),
        memory_used_after_mb=final.memory_used_mb,
        memory_returned=bool(after),
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--probe", action="store_true", help="take memory on one GPU and follow it in NVML")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--mb", type=int, default=1024, help="memory the probe takes")
    args = parser.parse_args()
    nvml, why = open_nvml()
    if nvml is None:
        print(json.dumps({"nvml": False, "error": f"{why}: a worker here gets simulated GPUs"}))
        return 1
    inventory = NvmlInventory(nvml)
    try:
        gpus = inventory.gpus()
        report: dict[str, object] = {
            "nvml": True,
            "driver": nvml.nvmlSystemGetDriverVersion(),
            "gpus": [asdict(g) for g in gpus],
        }
        total = gpus[args.index].memory_total_mb
        report["memory_limit_mb_for_fraction_0.25"] = max(1, int(total * 0.25))
        ok = all(g.uuid.startswith("GPU-") and g.memory_total_mb > 0 for g in gpus)
        if args.probe:
            checks = probe(inventory, args.index, args.mb)
            report["probe"] = checks
            ok = ok and bool(checks["pid_listed"] and checks["pid_gone_after_kill"] and checks["memory_returned"])
            ok = ok and int(checks["memory_taken_mb"]) >= args.mb  # type: ignore[call-overload]
        report["ok"] = ok
        print(json.dumps(report, indent=2, default=str))
        return 0 if ok else 1
    finally:
        inventory.close()


if __name__ == "__main__":
    sys.exit(main())
