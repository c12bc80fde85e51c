"""Engine and sessions: one session per request (API) or per unit of work (worker, scheduler).

SQLite runs in WAL mode with a busy timeout, and sessions that write start with
`BEGIN IMMEDIATE`: a transaction that read first and writes later would otherwise fail at
once with "database is locked" when another process wrote in between, instead of waiting.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_AUTOCHECKPOINT_PAGES = 20_000
WRITE_OPTION = "towerq_write"
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


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
    # The scheduler checkpoints the WAL in the background (`checkpoint`); a commit only does
    # it itself when the WAL has grown far, so requests rarely wait for one.
    cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_AUTOCHECKPOINT_PAGES}")
    cursor.close()


def _sqlite_on_begin(conn: Any) -> None:
    immediate = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class Database:
    """Sessions on one database: `read()` for queries, `write()` for a unit of work.

    What a write queued with `notify` (job events, scheduler kicks) is handed to the
    `on_commit` callbacks after the transaction committed and its locks are released.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_db_engine(url)
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        write_engine = self.engine.execution_options(**{WRITE_OPTION: True})
        self._write = sessionmaker(write_engine, expire_on_commit=False)
        self._writers = SqliteWriters(url) if self.is_sqlite else None
        self.on_commit: list[Callable[[dict[str, Any]], None]] = []

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session whose work is committed when the block ends, rolled back on error."""
        with self._writers or nullcontext(), self._write() as session:
            with session.begin():
                yield session
            info = dict(session.info)
        for callback in self.on_commit:
            callback(info)

    def checkpoint(self) -> None:
        """Copy the SQLite WAL into the database without blocking anyone (no-op elsewhere)."""
        if self.is_sqlite:
            with self.engine.connect() as connection:
                connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    def dispose(self) -> None:
        self.engine.dispose()
        if self._writers is not None:
            self._writers.close()


class SqliteWriters:
    """One SQLite writer at a time across this machine's towerq processes, queued on an
    exclusive lock (threads of a process on a mutex, processes on a file lock) instead of
    polling SQLite's busy handler, which is slow and unfair under load: some writers would
    wait past the busy timeout while others got through again and again."""

    def __init__(self, url: str) -> None:
        database = make_url(url).database
        self.path = Path(f"{database}.writers") if database and database != ":memory:" else None
        self.mutex = threading.Lock()
        self.handle: IO[bytes] | None = None

    def __enter__(self) -> SqliteWriters:
        self.mutex.acquire()
        if self.path is not None:
            if self.handle is None:
                self.handle = self.path.open("a+b")
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._wait(self.handle)
            self.handle.truncate(0)  # whose it is, for a writer that waits long (`_wait`)
            self.handle.write(str(os.getpid()).encode())
            self.handle.flush()
        return self

    @staticmethod
    def _wait(handle: IO[bytes]) -> None:
        """Wait for the lock, saying who holds it when that takes SLOW_WRITER_S: a process
        stopped (SIGSTOP, a debugger) or hung inside a write holds every writer of the
        service, the scheduler's detection of dead hosts included, until it goes on."""
        warning = threading.Timer(SLOW_WRITER_S, _say_who_writes, (handle.name,))
        warning.daemon = True
        warning.start()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        finally:
            warning.cancel()

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.mutex.release()

    def close(self) -> None:
        with self.mutex:
            if self.handle is not None:
                self.handle.close()
                self.handle = None


SLOW_WRITER_S = 5.0
"""A writer that waits this long for SQLite's one writer says in its log who that is."""


def _say_who_writes(lock_path: str) -> None:
    try:
        pid = int(Path(lock_path).read_text() or 0)
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (OSError, ValueError):
        pid, fields = 0, []
    state = {"T": "stopped", "t": "stopped by a debugger", "D": "waiting on the disk", "Z": "a zombie"}
    how = state.get(fields[0], "running") if fields else "gone"
    log.warning(
        "waiting over %.0f s for the database's write lock (SQLite: one writer at a time), held by pid %s (%s): "
        "every write of the service waits for it",
        SLOW_WRITER_S,
        pid or "?",
        how,
    )


def alembic_config(url: str) -> Any:
    """Alembic's configuration for the database at `url`, with towerq's migrations."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_database(url: str) -> None:
    """Migrate the database at `url` to the latest schema (the only way the schema changes)."""
    from alembic import command

    command.upgrade(alembic_config(url), "head")


class SchemaError(RuntimeError):
    """The database is not at the schema this towerq needs (not migrated, or newer)."""


def require_schema(url: str) -> None:
    """Refuse to serve a database that `towerq db upgrade` has not brought to this version's
    schema: a clear error at start, instead of a traceback at every request or pass."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    engine = create_db_engine(url)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
    if current == head:
        return
    if current is None:
        raise SchemaError("the database has no towerq schema yet: run `towerq db upgrade` first")
    raise SchemaError(
        f"the database is at schema {current}, this towerq needs {head}: run `towerq db upgrade` "
        "(or, if the database is newer, upgrade towerq)"
    )


def insert_ignoring_duplicates(session: Session, model: type[Any]) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING, on SQLite and on PostgreSQL."""
    if session.get_bind().dialect.name == "postgresql":
        return postgresql.insert(model).on_conflict_do_nothing()
    return sqlite.insert(model).on_conflict_do_nothing()
