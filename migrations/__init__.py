"""Alembic migrations: the only way towerq's schema changes."""
