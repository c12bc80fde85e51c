"""Whether a job fits the lab's GPUs at submit: the host, GPU ids and count it asks for
exist (a job larger than any host only over several whole ones), and a fraction of a real
GPU leaves it memory. A refusal names the field (`SpecError`)."""

from __future__ import annotations

from collections.abc import Sequence

from service.core.exceptions import SpecError
from service.core.settings import Settings
from service.lab.hosts import HostInventory
from towerq.contract.runtime import MIN_MEMORY_LIMIT_MB, memory_limit_mb
from towerq.contract.spec import JobSpec


def check_resources(inventory: HostInventory, spec: JobSpec) -> str | None:
    """Check that the GPUs asked for exist; returns the host the job is bound to, if any.
    A refusal is decided on a fresh inventory, not on the cached one."""
    if spec.gpus is not None and not inventory.executor.places_jobs:
        raise SpecError(
            "gpus", f"with TOWERQ_EXECUTOR={inventory.executor.name} the cluster picks the GPUs: ask for gpu_count"
        )
    try:
        return _check_resources(inventory.hosts(), spec, inventory.executor.places_jobs)
    except SpecError:
        return _check_resources(inventory.hosts(fresh=True), spec, inventory.executor.places_jobs)


def _check_resources(hosts: dict[str, list[int]], spec: JobSpec, places_jobs: bool = True) -> str | None:
    host = spec.host
    if host is not None and host not in hosts:
        known = ", ".join(sorted(hosts)) or "none yet"
        raise SpecError("host", f"unknown host {host!r} (registered hosts: {known})")
    if spec.gpus is not None:
        host = host or _only_host(hosts)
        missing = [i for i in spec.gpus if i not in hosts[host]]
        if missing:
            raise SpecError(
                "gpus",
                f"GPU {missing[0]} does not exist on {host} (it has GPUs {_ranges(hosts[host])})",
            )
        return host
    count = spec.gpu_count or 1
    sizes = [len(hosts[host])] if host is not None else [len(g) for g in hosts.values()]
    if sizes and count > max(sizes):
        if host is not None or not places_jobs:
            where = f"host {host}" if host is not None else "the largest host"
            raise SpecError("gpu_count", f"{count} GPUs asked for but {where} has {max(sizes)}")
        check_over_hosts(sizes, spec)
    return host


def check_over_hosts(sizes: list[int], spec: JobSpec) -> None:
    """A job larger than any host runs over several whole hosts of the largest size (one
    trainer, a rank, on each; `worker.trainer.ranks`): its GPU count must be a whole number
    of those hosts, and no more than the lab has. A command job's ranks talk over the
    hosts' network (`worker.gang`): it must ask for it."""
    count, largest = spec.gpu_count or 1, max(sizes)
    hosts = sizes.count(largest)
    most = largest * hosts
    if hosts < 2 or spec.is_notebook:
        raise SpecError("gpu_count", f"{count} GPUs asked for but the largest host has {largest}")
    if count > most:
        raise SpecError(
            "gpu_count",
            f"{count} GPUs asked for but the largest job the lab can hold is {most} GPUs ({hosts} hosts of {largest})",
        )
    if count % largest:
        raise SpecError(
            "gpu_count",
            f"{count} GPUs is more than one host has ({largest}): a job over several hosts takes whole hosts, "
            f"so ask for a multiple of {largest} (at most {most})",
        )
    if spec.gpu_memory_fraction < 1.0:
        raise SpecError("gpu_memory_fraction", "a job over several hosts takes whole GPUs: leave it at 1")
    if spec.tower_weights is not None:
        raise SpecError("tower_weights", "a job over several hosts has equal towers: leave tower_weights out")
    if spec.min_gpu_count is not None and spec.min_gpu_count < count:
        raise SpecError(
            "min_gpu_count",
            f"a job over several hosts ({count} GPUs; the largest host has {largest}) runs at its full size, "
            "never resized: leave min_gpu_count out, or ask for at most one host's GPUs",
        )
    if spec.is_command and not spec.network:
        raise SpecError(
            "network",
            f"a command job over several hosts ({count} GPUs; the largest host has {largest}) needs network: true: "
            "its processes reach each other over the hosts' network, on ports their framework picks, which "
            "towerq's rank tunnel cannot carry",
        )


def check_memory_fraction(inventory: HostInventory, spec: JobSpec, host: str | None, settings: Settings) -> None:
    """Refuse a fraction of a real GPU too small to leave the job memory after the card's
    reserve and its process's CUDA context (simulated GPUs have no real limit)."""
    if spec.gpu_memory_fraction >= 1.0:
        return
    smallest = inventory.smallest_gpu_mb()
    sizes = [smallest.get(host)] if host is not None else list(smallest.values())
    if not sizes or any(size is None for size in sizes):
        return
    best = max(size for size in sizes if size is not None)
    reserved, overhead = settings.gpu_memory_reserved_mb, settings.gpu_process_overhead_mb
    left = memory_limit_mb(spec.gpu_memory_fraction, best, reserved, overhead)
    if left < MIN_MEMORY_LIMIT_MB:
        raise SpecError(
            "gpu_memory_fraction",
            f"{spec.gpu_memory_fraction} of a {best} MB GPU leaves {left} MB after the {reserved} MB the card "
            f"reserves and the {overhead} MB each process's CUDA context costs (at least {MIN_MEMORY_LIMIT_MB} MB)",
        )


def _only_host(hosts: dict[str, list[int]]) -> str:
    if not hosts:
        raise SpecError("gpus", "no GPU host has registered yet: start `towerq worker` first")
    if len(hosts) > 1:
        names = ", ".join(sorted(hosts))
        raise SpecError("host", f"several hosts have GPUs ({names}): say which one with 'host'")
    return next(iter(hosts))


def _ranges(indices: Sequence[int]) -> str:
    if not indices:
        return "none"
    if list(indices) == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        return f"{indices[0]}-{indices[-1]}"
    return ", ".join(str(i) for i in indices)
