"""Executors are found by name in a registry: a new one registers itself (no branch to add in
`executor_for` or the settings), and a name no executor has is refused when a process starts,
naming those known, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from service.core.settings import Settings
from service.executors import EXECUTORS, LocalExecutor, SlurmExecutor, UnknownExecutorError, executor_for, register

REPO = Path(__file__).resolve().parents[3]


def test_each_name_builds_its_executor_and_a_registered_one_is_found(
    make_settings: Callable[..., Settings], sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection = redis.Redis()
    assert isinstance(executor_for(make_settings(sqlite_url), connection), LocalExecutor)
    assert isinstance(executor_for(make_settings(sqlite_url, executor="slurm"), connection), SlurmExecutor)
    monkeypatch.setitem(EXECUTORS, "lab-b", lambda settings, connection: LocalExecutor(connection))
    assert isinstance(executor_for(make_settings(sqlite_url, executor="lab-b"), connection), LocalExecutor)
    with pytest.raises(ValueError, match="already registered"):
        register("lab-b", lambda settings, connection: SlurmExecutor(settings))
    with pytest.raises(UnknownExecutorError, match=r"no executor named 'nomad' \(known: lab-b, local, slurm\)"):
        executor_for(make_settings(sqlite_url, executor="nomad"), connection)


def test_a_process_refuses_to_start_on_an_executor_nobody_registered(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOWERQ_")}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(REPO), TOWERQ_EXECUTOR="nomad")
    for command in ("api", "up"):
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", command], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert done.stderr.strip() == "towerq: TOWERQ_EXECUTOR: no executor named 'nomad' (known: local, slurm)", (
            command,
            done.stderr,
        )
