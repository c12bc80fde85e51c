#!/usr/bin/env python3
"""Screenshots of every dashboard page at desktop and phone width, for docs/screenshots/.

    .venv/bin/python scripts/screenshots.py

It seeds a lab of a few hundred jobs (scripts/seed-lab.py) into a fresh SQLite database,
starts a Redis and the API on it, and photographs each page in headless Chromium (Debian's
package, as the tests drive it) as the member alice sees it. docs/screenshots/README.md
lists the pictures and the fingerprint of the dashboard's files they were made from;
tests/test_screenshots.py fails, naming this command, once the dashboard has changed since.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.screenshots import FOLDER, PAGES, VIEWPORTS, fingerprint, index_text  # noqa: E402


def main() -> int:
    import httpx
    from playwright.sync_api import sync_playwright

    from service.cli.redis_server import EmbeddedRedis
    from service.core.db import Database, upgrade_database
    from service.lab.auth import create_token
    from tests.browser import CHROMIUM, CHROMIUM_ARGS
    from tests.conftest import free_port

    with tempfile.TemporaryDirectory(prefix="towerq-shots-") as scratch:
        work = Path(scratch)
        url = f"sqlite:///{work / 'towerq.db'}"
        upgrade_database(url)
        seed_lab = _seed_module()
        seed_lab.main(["--database-url", url])
        db = Database(url)
        with db.write() as session:
            token = create_token(session, "alice")[1]
        db.dispose()
        ids = _examples(work / "towerq.db")

        redis = EmbeddedRedis(f"redis://127.0.0.1:{free_port()}/0", work / "redis")
        redis.start()
        port = free_port()
        env = {
            **os.environ,
            "TOWERQ_DATABASE_URL": url,
            "TOWERQ_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
            "TOWERQ_VAR_DIR": str(work / "var"),
            "TOWERQ_ARTIFACTS_DIR": str(work / "artifacts"),
            "TOWERQ_HEARTBEAT_TIMEOUT_S": "86400",  # the seeded hosts count as up: no worker runs here
            "TOWERQ_API_WORKERS": "1",
        }
        api = subprocess.Popen([sys.executable, "-m", "service.cli", "api", "--port", str(port)], env=env, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_for(lambda: httpx.get(f"{base}/healthz", timeout=1).status_code == 200)
            FOLDER.mkdir(parents=True, exist_ok=True)
            with sync_playwright() as playwright:
                chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                for width_name, (width, height) in VIEWPORTS.items():
                    context = chromium.new_context(viewport={"width": width, "height": height})
                    page = context.new_page()
                    page.goto(f"{base}/?token={token}#/jobs")
                    page.wait_for_selector("#who")
                    for name, (address, ready) in PAGES.items():
                        page.goto(f"{base}/#/{address.format(**ids)}")
                        page.wait_for_selector(ready, timeout=30_000)
                        page.wait_for_timeout(600)  # charts settle to their width
                        page.screenshot(path=str(FOLDER / f"{name}-{width_name}.png"))
                        print(f"{name}-{width_name}.png")
                    context.close()
                chromium.close()
        finally:
            api.terminate()
            api.wait(30)
            redis.stop()
    (FOLDER / "README.md").write_text(index_text(fingerprint()))
    return 0


def _seed_module() -> object:
    spec = importlib.util.spec_from_file_location("seed_lab", REPO / "scripts" / "seed-lab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _examples(path: Path) -> dict[str, int]:
    """The jobs and sweep the pictures show: a running job with curves, a failed one, a sweep,
    and two finished jobs to compare."""
    with sqlite3.connect(path) as db:
        one = lambda sql: db.execute(sql).fetchone()[0]  # noqa: E731
        running = one("SELECT id FROM jobs WHERE state = 'running' AND step > 1000 ORDER BY id LIMIT 1")
        failed = one("SELECT id FROM jobs WHERE state = 'failed' ORDER BY id DESC LIMIT 1")
        sweep = one("SELECT sweep_id FROM jobs WHERE sweep_id IS NOT NULL GROUP BY sweep_id ORDER BY count(*) DESC")
        done = [row[0] for row in db.execute("SELECT id FROM jobs WHERE state = 'succeeded' ORDER BY id DESC LIMIT 3")]
    return {"running": running, "failed": failed, "sweep": sweep, "a": done[0], "b": done[1], "c": done[2]}


def _wait_for(ready: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():  # type: ignore[operator]
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.3)
    raise SystemExit("the API did not answer in time")


if __name__ == "__main__":
    sys.exit(main())
