"""A trainer's environment is an allow-list of names. It used to allow prefixes (`TF_*`,
`LC_*`, `CUDA_*`, ...), and other tools own names under them: Terraform's
`TF_VAR_database_url=postgresql://…` went through to every member's code."""

from __future__ import annotations

import pytest

from worker.launch import trainer_environment

LEAKS = {
    "TF_VAR_database_url": "postgresql://towerq:hunter2@db/towerq",
    "LC_SECRET_STUFF": "x",
    "CUDA_MPS_PIPE_DIRECTORY": "/run/other-lab",
    "OMP_SECRETS": "y",
    "NCCL_SOME_OWNER": "z",
    "TOWERQ_DATABASE_URL": "postgresql://towerq:hunter2@db/towerq",
    "AWS_SECRET_ACCESS_KEY": "a",
}
KEPT = {"TF_CPP_MIN_LOG_LEVEL": "2", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "4", "NCCL_DEBUG": "INFO"}


def test_only_named_variables_reach_a_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**LEAKS, **KEPT}.items():
        monkeypatch.setenv(name, value)
    env = trainer_environment([1])
    assert not set(LEAKS) & set(env), sorted(set(LEAKS) & set(env))
    assert {name: env[name] for name in KEPT} == KEPT
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_an_admin_adds_names_but_never_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    env = trainer_environment([], "WANDB_MODE, WANDB_*")
    assert env["WANDB_MODE"] == "offline" and "WANDB_API_KEY" not in env
