"""Server commands: up, api, worker, scheduler, db upgrade, health (simulate: `simulate`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from service.core import defaults
from service.core.db import require_schema, upgrade_database
from service.core.settings import Settings, redacted


def add_commands(commands: Any) -> None:
    up = commands.add_parser("up", help="start everything for this machine: API + dashboard, scheduler, worker, Redis")
    up.add_argument("--host", default=None, help="address the API listens on (default TOWERQ_API_HOST, 127.0.0.1)")
    up.add_argument("--port", type=int, default=None, help="port of the API (default TOWERQ_API_PORT, 8000)")
    up.add_argument("--no-worker", action="store_true", help="do not start a worker for this host")
    up.set_defaults(run=run_up)

    api = commands.add_parser("api", help="serve the REST API and the dashboard")
    api.add_argument("--host", default=None)
    api.add_argument("--port", type=int, default=None)
    api.add_argument("--workers", type=int, default=None, help="API processes (default TOWERQ_API_WORKERS, 2)")
    api.set_defaults(run=run_api)

    worker = commands.add_parser("worker", help="run jobs on this host's GPUs")
    worker.add_argument("--name", default=None, help="host name (default TOWERQ_HOST_NAME, the hostname)")
    worker.set_defaults(run=run_worker)

    scheduler = commands.add_parser("scheduler", help="place queued jobs on free GPUs")
    scheduler.set_defaults(run=run_scheduler)

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_commands.add_parser("upgrade", help="migrate the database to the latest schema").set_defaults(run=run_db_upgrade)

    health = commands.add_parser("health", help="exit 0 when a towerq process is healthy (container healthchecks)")
    health_of = health.add_subparsers(dest="health_command", required=True, metavar="PROCESS")
    api_health = health_of.add_parser("api", help="the API answers /healthz with its database and Redis ok")
    api_health.add_argument("--url", default=None, help="the API (default http://127.0.0.1:TOWERQ_API_PORT)")
    api_health.set_defaults(run=run_health_api)
    worker_health = health_of.add_parser("worker", help="this host's worker sent a heartbeat lately")
    worker_health.add_argument("--name", default=None, help="host name (default TOWERQ_HOST_NAME, the hostname)")
    worker_health.set_defaults(run=run_health_worker)


def stop_on_signals(stop: threading.Event) -> None:
    def handle(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def run_db_upgrade(args: argparse.Namespace) -> int:
    settings = Settings()
    upgrade_database(settings.database_url)
    print(f"database at {redacted(settings.database_url)} is up to date")
    return 0


def run_api(args: argparse.Namespace) -> int:
    import uvicorn

    from service.api.app import create_app
    from service.core.context import Context
    from service.executors import known_executor

    settings = Settings()
    known_executor(settings.executor)  # refused here rather than in a server process
    require_schema(settings.database_url)
    Context.open(settings).close()  # its claim on Redis, refused here rather than in a server process
    host = args.host or settings.api_host
    port = args.port or settings.api_port
    workers = args.workers or settings.api_workers
    # Behind a reverse proxy: its X-Forwarded-Proto makes the session cookie Secure over HTTPS.
    serving: dict[str, Any] = dict(
        host=host,
        port=port,
        root_path=settings.root_path,
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=defaults.API_SHUTDOWN_GRACE_S,
    )
    if workers == 1:
        uvicorn.run(create_app(settings), **serving)
    else:  # each process builds its own app from the same TOWERQ_ settings, and dies with this one
        os.environ["TOWERQ_API_PARENT_PID"] = str(os.getpid())
        uvicorn.run("service.api.app:create_app", factory=True, workers=workers, **serving)
    return 0


def run_worker(args: argparse.Namespace) -> int:
    from service.core.context import Context
    from worker.agent import HostAgent, NoGpusError, SandboxError

    settings = Settings()
    require_schema(settings.database_url)
    ctx = Context.open(settings)
    try:
        HostAgent(ctx, args.name or settings.host_name).run()
    except (NoGpusError, SandboxError) as err:
        print(f"towerq: {err}", file=sys.stderr)
        return 1
    finally:
        ctx.close()
    return 0


def run_scheduler(args: argparse.Namespace) -> int:
    from service.cli.scheduling import serve
    from service.core.context import Context

    settings = Settings()
    require_schema(settings.database_url)
    ctx = Context.open(settings)
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        serve(ctx, stop)
    finally:
        ctx.close()
    return 0


def run_health_api(args: argparse.Namespace) -> int:
    import httpx

    settings = Settings()
    url = (args.url or f"http://127.0.0.1:{settings.api_port}").rstrip("/")
    try:
        answer = httpx.get(f"{url}/healthz", timeout=5.0)
        status = answer.json() if answer.status_code == 200 else {"status": f"HTTP {answer.status_code}"}
    except (httpx.HTTPError, ValueError) as err:
        status = {"status": f"no answer ({type(err).__name__})"}
    print(" ".join(f"{key}={value}" for key, value in status.items()))
    return 0 if status.get("status") == "ok" else 1


def run_health_worker(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from service.core.db import Database
    from service.core.models import Host, utcnow

    settings = Settings()
    name = args.name or settings.host_name
    db = Database(settings.database_url)
    try:
        with db.read() as session:
            host = session.scalars(select(Host).where(Host.name == name)).one_or_none()
            seen = None if host is None else host.last_heartbeat_at
    finally:
        db.dispose()
    if seen is None:
        print(f"worker {name}: never registered")
        return 1
    age = (utcnow() - seen).total_seconds()
    fresh = age <= settings.heartbeat_timeout_s
    print(
        f"worker {name}: last heartbeat {age:.1f}s ago"
        + ("" if fresh else f" (over {settings.heartbeat_timeout_s:g}s)")
    )
    return 0 if fresh else 1


def run_up(args: argparse.Namespace) -> int:
    from service.cli.up import Supervisor
    from service.executors import known_executor
    from worker.disk_kind import check
    from worker.sandbox import SandboxError, resolve

    settings = Settings()
    known_executor(settings.executor)  # said once, before anything starts
    if not args.no_worker:
        try:  # said once, before anything starts, not by a worker restarted five times
            resolve(settings.sandbox)
            check(settings.job_disk, settings.var_dir)
        except SandboxError as err:
            print(f"towerq: {err}", file=sys.stderr)
            return 1
    return Supervisor(
        settings, host=args.host or settings.api_host, port=args.port or settings.api_port, worker=not args.no_worker
    ).run()
