"""How many CPUs an attempt asks Slurm for (`sbatch --cpus-per-task`).

An attempt is one Slurm task (`--ntasks=1`), and Slurm gives a task one CPU unless told
otherwise: a trainer with four towers, or a command job's four processes (`per_gpu`), would
share one core wherever the cluster confines jobs to their CPUs (task/affinity, cgroup).
Per GPU, towerq asks:

- `TOWERQ_SLURM_CPUS_PER_GPU`, where the admin set it (0: nothing, Slurm's own defaults);
- otherwise nothing where every partition it submits to has a `DefCpuPerGPU` (the admin's
  own figure, per partition or cluster-wide): Slurm applies it;
- otherwise the nodes' share: CPUs ÷ GPUs of the partitions' nodes, the smallest among them
  (of the node asked for, where a job names one), so that a node's CPUs go round as its GPUs
  do: a job with g of a node's G GPUs asks at most g/G of its CPUs, never more than a node
  with the GPUs has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeRow:
    node: str
    partition: str
    default: bool
    """The cluster's default partition (where a job naming none goes)."""
    gpus: int
    cpus: int
    state: str


@dataclass(frozen=True)
class CpuView:
    """What decides the CPUs asked: the nodes, the partitions an attempt may go to, and
    whether Slurm has a `DefCpuPerGPU` of its own for each of them."""

    rows: list[NodeRow]
    used: set[str]
    slurms_own: bool


def partitions_used(rows: list[NodeRow], setting: str) -> set[str]:
    """The partitions an attempt may go to: those `TOWERQ_SLURM_PARTITION` names, else the
    cluster's default (else, with no default, every partition)."""
    named = {name for name in setting.split(",") if name}
    if named:
        return named
    defaults = {row.partition for row in rows if row.default}
    return defaults or {row.partition for row in rows}


_DEF_CPU_PER_GPU = re.compile(r"\bDefCpuPerGPU=(\d+)")


def slurm_sets_cpus_per_gpu(partitions_out: str, config_out: str, used: set[str]) -> bool:
    """Whether Slurm gives each of `used` a `DefCpuPerGPU`: its own (`scontrol show
    partition -o`'s `JobDefaults=`) or the cluster's (`scontrol show config`)."""
    if _DEF_CPU_PER_GPU.search(_config_job_defaults(config_out)):
        return True
    having = set()
    for line in partitions_out.splitlines():
        name = re.match(r"PartitionName=(\S+)", line)
        defaults = re.search(r"\bJobDefaults=(\S+)", line)
        if name and defaults and _DEF_CPU_PER_GPU.search(defaults.group(1)):
            having.add(name.group(1))
    return bool(used) and used <= having


def _config_job_defaults(config_out: str) -> str:
    for line in config_out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "JobDefaults":
            return value.strip()
    return ""


def share_per_gpu(rows: list[NodeRow], used: set[str], node: str = "") -> int | None:
    """A node's CPUs per GPU, the smallest among the nodes with GPUs in `used` (only `node`,
    where a job names one); at least 1. None where no such node is known."""
    ratios = [
        row.cpus // row.gpus for row in rows if row.gpus and row.partition in used and (not node or row.node == node)
    ]
    return max(1, min(ratios)) if ratios else None
