"""What a command job's program is given (`"command"` and `"env"` in its spec): an argv
without NUL characters, and variables it may set, which are never those towerq sets for the
program (its GPUs, ranks, folders, memory hints) nor those that change how every program of
the sandbox loads (`LD_PRELOAD`, `PYTHONHOME`). Every refusal names the variable. And the
packages it runs with besides the lab's (`"requirements"`): each a package's name and
versions, nothing pip would read as an option, a URL or a path."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
RESERVED_ENV_PREFIXES = ("TOWERQ_", "LD_", "BASH_FUNC_", "NVIDIA_", "NCCL_", "MASTER_", "SLURM_")
RESERVED_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "TF_CONFIG",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "PYTORCH_CUDA_ALLOC_CONF",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "PYTHONHOME",
        "HOME",
        # what glibc steers a privileged program by, and leaves out for a setuid one (its
        # UNSECURE_ENVVARS): bwrap starts as root with the job's environment
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
    }
)
"""What a command job's `env` may not set: what towerq sets for the program (its GPUs, ranks,
folders, memory hints), what changes how every program of the sandbox loads, and what
glibc lets steer a privileged program (bwrap starts as root with the job's environment)."""
COMMAND_MAX_ARGS = 1024
COMMAND_ARG_MAX = 4096
ENV_MAX_ENTRIES = 64
ENV_VALUE_MAX = 4096


def env_name(name: str) -> str:
    if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
        raise ValueError(f"{name} is not a job's to set: towerq sets it, or it changes how every program loads")
    return name


def no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("a NUL character cannot be passed to a program")
    return text


EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN), AfterValidator(env_name)]
EnvValue = Annotated[str, Field(max_length=ENV_VALUE_MAX), AfterValidator(no_nul)]
CommandArg = Annotated[str, Field(max_length=COMMAND_ARG_MAX), AfterValidator(no_nul)]


REQUIREMENTS_MAX = 100
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"
_VERSION = r"(?:~=|===|==|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]{1,64}"
REQUIREMENT = re.compile(
    rf"^(?P<name>{_NAME})(?:\[{_NAME}(?:\s*,\s*{_NAME})*\])?\s*(?:{_VERSION}(?:\s*,\s*{_VERSION}){{0,7}})?$"
)
"""A package as pip installs it from the lab's index: `einops`, `transformers==4.46.1`,
`jax[cuda12]>=0.4,<0.5`. No markers, URLs (`pkg @ https://...`), paths or options."""


def requirement(text: str) -> str:
    if not REQUIREMENT.match(text.strip()):
        raise ValueError(
            f"{text[:80]!r} is not a package and its versions, as einops or transformers==4.46.1 "
            "(no options, URLs, paths or markers: packages come from the lab's index)"
        )
    return text.strip()


Requirement = Annotated[str, Field(max_length=300), AfterValidator(requirement)]
