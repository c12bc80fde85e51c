"""Setting up the trainer's devices, before TensorFlow's runtime starts.

- Simulated GPUs: k logical CPU devices (`/device:CPU:0..k-1`); a memory fraction is
  recorded but not enforced. The cores are shared out: cores/k threads per op, k ops at
  once.
- Real GPUs (the process sees only its own, through `CUDA_VISIBLE_DEVICES`): a memory
  fraction f < 1 becomes a logical-device `memory_limit` of f × the GPU's total memory
  (MB, from NVML via the worker). That is the only limit eager TF2 honours; the v1
  `per_process_gpu_memory_fraction` is read by v1 Sessions only. A memory limit cannot be
  combined with memory growth, so asking for both is refused before anything starts.
  Soft placement is on, so an op without a GPU kernel falls back to the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import tensorflow as tf

from towerq.contract.runtime import MIN_MEMORY_LIMIT_MB, RuntimeSpec, memory_limit_mb
from worker.trainer.errors import DeviceError


@dataclass
class DeviceSetup:
    devices: list[str]
    variable_device: str
    simulated: bool
    memory_limit_mb: list[int] | None
    memory_limit_enforced: bool


def memory_limits_mb(runtime: RuntimeSpec, count: int) -> list[int] | None:
    """Per-GPU memory limits in MB for the runtime's fraction (None for the whole GPU),
    net of the card's reserved memory and the process's own CUDA context."""
    fraction, totals_mb = runtime.gpu_memory_fraction, runtime.gpu_memory_total_mb
    if fraction >= 1.0:
        return None
    if len(totals_mb) < count:
        raise DeviceError(f"total memory of {count} GPUs needed for a memory fraction, got {len(totals_mb)}")
    limits = [
        memory_limit_mb(fraction, total, runtime.gpu_memory_reserved_mb, runtime.gpu_process_overhead_mb)
        for total in totals_mb[:count]
    ]
    if min(limits) < MIN_MEMORY_LIMIT_MB:
        raise DeviceError(
            f"gpu_memory_fraction {fraction} leaves {min(limits)} MB of a {min(totals_mb[:count])} MB GPU after the "
            f"{runtime.gpu_memory_reserved_mb} MB the card reserves and the {runtime.gpu_process_overhead_mb} MB a "
            f"process's CUDA context costs (at least {MIN_MEMORY_LIMIT_MB} MB needed)"
        )
    return limits


def configure(runtime: RuntimeSpec, variable_device: str) -> DeviceSetup:
    """Create the tower devices; must run before any TensorFlow op."""
    tf.config.set_soft_device_placement(True)
    k = runtime.num_devices
    if runtime.simulated:
        return _simulated(k)
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < k:
        raise DeviceError(
            f"{k} GPUs allocated but TensorFlow sees {len(gpus)} (is a CUDA build of TensorFlow installed?)"
        )
    limits = memory_limits_mb(runtime, k)
    if limits is not None and runtime.memory_growth:
        raise DeviceError("memory_growth cannot be combined with gpu_memory_fraction < 1")
    try:
        for i, gpu in enumerate(gpus[:k]):
            if limits is not None:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limits[i])]
                )
            elif runtime.memory_growth:
                tf.config.experimental.set_memory_growth(gpu, True)
    except (RuntimeError, ValueError) as err:
        raise DeviceError(f"cannot configure GPU memory: {err}") from err
    devices = [f"/device:GPU:{i}" for i in range(k)]
    return DeviceSetup(
        devices=devices,
        variable_device="/device:CPU:0" if variable_device == "cpu" else devices[0],
        simulated=False,
        memory_limit_mb=limits,
        memory_limit_enforced=limits is not None,
    )


def _simulated(k: int) -> DeviceSetup:
    # k towers share this host's cores: each tower's ops run on fewer threads and the
    # towers run side by side (bench/trainer_throughput.py measures the gain).
    cores = len(os.sched_getaffinity(0))
    tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // k))
    tf.config.threading.set_inter_op_parallelism_threads(max(2, k))
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * k)
    except RuntimeError as err:
        raise DeviceError(f"logical CPU devices must be set before TensorFlow starts: {err}") from err
    devices = [f"/device:CPU:{i}" for i in range(k)]
    return DeviceSetup(
        devices=devices, variable_device=devices[0], simulated=True, memory_limit_mb=None, memory_limit_enforced=False
    )
