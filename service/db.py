"""Engine and sessions: one session per request (API) or per unit of work (worker, scheduler).

SQLite runs in WAL mode with a busy timeout, and sessions that write start with
`BEGIN IMMEDIATE`: a transaction that read first and writes later would otherwise fail at
once with "database is locked" when another process wrote in between, instead of waiting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE_OPTION = "towerq_write"


def create_db_engine(url: str) -> Engine:
    """An engine for `url`; for SQLite the file's folder is created and the pragmas set."""
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    database = make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        pool_size=20,
        max_overflow=40,
    )
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Hand transaction control to SQLAlchemy's "begin" event (pysqlite's own is broken).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def _sqlite_on_begin(conn: Any) -> None:
    immediate = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class Database:
    """Sessions on one database: `read()` for queries, `write()` for a unit of work."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_db_engine(url)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        write_engine = self.engine.execution_options(**{WRITE_OPTION: True})
        self._write = sessionmaker(write_engine, expire_on_commit=False)

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def new_read_session(self) -> Session:
        return self._read()

    def new_write_session(self) -> Session:
        return self._write()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session whose work is committed when the block ends, rolled back on error."""
        with self._write() as session, session.begin():
            yield session

    @property
    def sessionmakers(self) -> tuple[sessionmaker[Session], sessionmaker[Session]]:
        return self._read, self._write

    def dispose(self) -> None:
        self.engine.dispose()
