"""Alembic environment: the URL comes from towerq's settings unless the caller set one."""

from typing import Any

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection

from service.core.db import create_db_engine
from service.core.models import Base, UTCDateTime
from service.core.settings import Settings

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    return config.get_main_option("sqlalchemy.url") or Settings().database_url


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | bool:
    """Write towerq's UTCDateTime as the plain column type it stores, so that a migration
    never imports the models (which move on after the migration is written)."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


CONFIGURE = {"target_metadata": target_metadata, "render_as_batch": True, "render_item": render_item}


def run_migrations_offline() -> None:
    context.configure(url=database_url(), **CONFIGURE)
    with context.begin_transaction():
        context.run_migrations()


def run_with(connection: Connection) -> None:
    context.configure(connection=connection, **CONFIGURE)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_db_engine(database_url())
    try:
        with engine.connect() as connection:
            run_with(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
