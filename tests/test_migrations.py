"""The schema changes only through migrations: they build exactly what the models describe."""

from __future__ import annotations

from alembic import command

from service.core.db import alembic_config


def test_migrations_match_the_models(database_url: str) -> None:
    command.check(alembic_config(database_url))  # raises if autogenerate would find changes


def test_downgrade_and_upgrade_again(database_url: str) -> None:
    config = alembic_config(database_url)
    command.downgrade(config, "base")
    command.upgrade(config, "head")
    command.check(config)
