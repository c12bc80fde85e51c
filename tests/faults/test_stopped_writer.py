"""With SQLite one process writes at a time (`service.core.db.SqliteWriters`). A process
stopped inside a write (SIGSTOP, a debugger, a hung disk) holds every other writer of the
service until it goes on: a clean-clone `make test` saw the scheduler mark no host down for
30 s because the paused worker it was to detect had been stopped mid-write (issue 50).
Reproduced here deterministically: a writer stops itself inside its write. The waiting
writer says in its log who holds the lock and that it is stopped, and goes on once it does."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from service.core.db import SLOW_WRITER_S, Database

pytestmark = pytest.mark.slow

STOPS_INSIDE_A_WRITE = """
import os, signal, sys
from sqlalchemy import text
from service.core.db import Database

with Database(sys.argv[1]).write() as session:
    session.execute(text("INSERT INTO notes VALUES ('stopped writer')"))
    print("inside", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_a_writer_stopped_inside_a_write_is_named_by_those_it_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'towerq.db'}"
    db = Database(url)
    with db.write() as session:
        session.execute(text("CREATE TABLE notes (what TEXT)"))
    stopped = subprocess.Popen(
        [sys.executable, "-c", STOPS_INSIDE_A_WRITE, url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        assert stopped.stdout is not None and stopped.stdout.readline().strip() == "inside"
        done = threading.Event()

        def write() -> None:
            with db.write() as session:
                session.execute(text("INSERT INTO notes VALUES ('waited')"))
            done.set()

        with caplog.at_level(logging.WARNING, logger="service.core.db"):
            threading.Thread(target=write, daemon=True).start()
            assert not done.wait(SLOW_WRITER_S + 1.5), "a write got past a writer stopped inside its write"
            said = [r.getMessage() for r in caplog.records if "write lock" in r.getMessage()]
        assert said and f"held by pid {stopped.pid} (stopped)" in said[0], said
        os.kill(stopped.pid, signal.SIGCONT)
        assert stopped.wait(30) == 0
        assert done.wait(30), "the write did not go on once the stopped writer did"
    finally:
        if stopped.poll() is None:
            os.kill(stopped.pid, signal.SIGCONT)
            stopped.kill()
            stopped.wait()
    with db.read() as session:
        assert sorted(session.execute(text("SELECT what FROM notes")).scalars()) == ["stopped writer", "waited"]
    db.dispose()
