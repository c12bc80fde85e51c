"""The schema changes only through migrations: they build exactly what the models describe."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from service.cli.server import MIGRATIONS


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url)
    return config


def test_migrations_match_the_models(database_url: str) -> None:
    command.check(alembic_config(database_url))  # raises if autogenerate would find changes


def test_downgrade_and_upgrade_again(database_url: str) -> None:
    config = alembic_config(database_url)
    command.downgrade(config, "base")
    command.upgrade(config, "head")
    command.check(config)
