"""The schema changes only through migrations: they build exactly what the models describe."""

from __future__ import annotations

from alembic import command
from sqlalchemy import select, text

from service.core.db import Database, alembic_config
from service.core.models import Job, JobState, User


def test_migrations_match_the_models(database_url: str) -> None:
    command.check(alembic_config(database_url))  # raises if autogenerate would find changes


def test_downgrade_and_upgrade_again(database_url: str) -> None:
    config = alembic_config(database_url)
    command.downgrade(config, "base")
    command.upgrade(config, "head")
    command.check(config)


def test_a_command_job_and_a_notebook_lose_the_trainer_s_default_steps(database_url: str) -> None:
    """Migration 0026: a command job's or a notebook's steps are its program's (total_steps
    None); a model job keeps its own; down and up again, the same."""
    config = alembic_config(database_url)
    db = Database(database_url)
    try:
        specs = {
            "model": {"model": "mlp", "dataset": "digits"},
            "command": {"command": ["python", "train.py"], "code": "ab" * 32},
            "notebook": {"kind": "notebook"},
        }
        with db.write() as session:
            owner = User(name="alice")
            session.add(owner)
            session.flush()
            for name, spec in specs.items():
                session.add(Job(name=name, user_id=owner.id, state=JobState.QUEUED, spec=spec, gpu_count=1,
                                total_steps=None if name != "model" else 500, attempts=1))  # fmt: skip
        command.downgrade(config, "0025")
        with db.read() as session:
            rows = dict((n, t) for n, t in session.execute(text("SELECT name, total_steps FROM jobs")))
        assert rows == {"model": 500, "command": 1000, "notebook": 1000}, "as 0025 stored them"
        command.upgrade(config, "head")
        with db.read() as session:
            assert dict((n, t) for n, t in session.execute(select(Job.name, Job.total_steps))) == {
                "model": 500,
                "command": None,
                "notebook": None,
            }
    finally:
        db.dispose()
