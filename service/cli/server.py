"""Server commands: up, api, worker, scheduler, db upgrade, simulate."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from service.core import defaults
from service.core.db import require_schema, upgrade_database
from service.core.settings import Settings, redacted
from service.scheduler.types import Policy


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

    add_simulate(commands)


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


def add_simulate(commands: Any) -> None:
    simulate = commands.add_parser(
        "simulate",
        help="replay a job trace through a scheduling policy; --from-db: the lab's own jobs, as it is and what if",
    )
    source = simulate.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace", type=Path, help="CSV: submit_time_s,duration_s,num_gpus,user[,gpu_fraction][,time_limit_s][,group]"
    )
    source.add_argument(
        "--from-db",
        action="store_true",
        help="the lab's own ended jobs (TOWERQ_DATABASE_URL) of --since..--until, replayed on the lab as it is and "
        "with the options given (--hosts, --gpus-per-host, --policy, --time-slice), side by side",
    )
    simulate.add_argument("--since", default="30d", help="with --from-db: an ISO time or an age (default 30d)")
    simulate.add_argument("--until", default=None, help="with --from-db: an ISO time or an age (default now)")
    simulate.add_argument(
        "--export", type=Path, default=None, metavar="CSV", help="with --from-db: write the trace there, replay nothing"
    )
    simulate.add_argument(
        "-o", "--output", dest="output_format", choices=("table", "json"), default=None,
        help="with --from-db: table (default, as the What-if page) or json; a --trace replay prints JSON",
    )  # fmt: skip
    simulate.add_argument("--hosts", type=int, default=None, help="required with --trace")
    simulate.add_argument("--gpus-per-host", type=int, default=None, help="required with --trace")
    policies = [policy.value for policy in Policy]
    simulate.add_argument("--policy", default=None, choices=policies, help="default towerq")
    simulate.add_argument(
        "--estimates", default="none", choices=["none", "oracle"], help="oracle: true durations become time limits"
    )
    simulate.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    simulate.add_argument(
        "--time-slice",
        type=float,
        default=None,
        metavar="GPU_SECONDS",
        help="time slicing after this many GPU-seconds, 0 for none (default TOWERQ_TIME_SLICE_GPU_S, 3600)",
    )
    simulate.add_argument(
        "--elastic",
        type=float,
        default=None,
        metavar="SHARE",
        help="replay this share (0-1) of the jobs on 2 to one host's GPUs as elastic down to 1 GPU (default 0)",
    )
    simulate.add_argument(
        "--group-shares",
        default="",
        metavar="GROUP=SHARE,...",
        help="the shares of the trace's groups (its `group` column), e.g. vision=2,nlp=1 (default 1 each)",
    )
    simulate.set_defaults(run=run_simulate)


def group_shares(text: str) -> dict[str, float]:
    """`vision=2,nlp=1` as {group: share}; ValueError naming what is wrong."""
    shares: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            share = float(value)
        except ValueError:
            raise ValueError(f"{part!r}: give GROUP=SHARE, the share a number") from None
        if not name or not share > 0:
            raise ValueError(f"{part!r}: give GROUP=SHARE, the share above 0")
        shares[name] = share
    return shares


def run_simulate(args: argparse.Namespace) -> int:
    import json
    import sys

    from service.scheduler.simulate import simulate
    from service.scheduler.trace import TraceError, read_trace
    from service.scheduler.types import Policy, PolicyConfig

    if (args.hosts is not None and args.hosts < 1) or (args.gpus_per_host is not None and args.gpus_per_host < 1):
        print("towerq: --hosts and --gpus-per-host must be at least 1", file=sys.stderr)
        return 2
    if args.time_slice is not None and not args.time_slice >= 0:
        print("towerq: --time-slice must be 0 (off) or a number of GPU-seconds", file=sys.stderr)
        return 2
    if args.elastic is not None and not 0 <= args.elastic <= 1:
        print("towerq: --elastic must be a share from 0 to 1", file=sys.stderr)
        return 2
    if args.from_db:
        return _simulate_from_db(args)
    if args.hosts is None or args.gpus_per_host is None:
        print("towerq: with --trace, give --hosts and --gpus-per-host", file=sys.stderr)
        return 2
    time_slice = Settings().time_slice_gpu_s if args.time_slice is None else args.time_slice
    try:
        jobs = read_trace(args.trace, limit=args.limit)
    except TraceError as err:
        print(f"towerq: {err}", file=sys.stderr)
        return 2
    try:
        shares = group_shares(args.group_shares)
    except ValueError as err:
        print(f"towerq: --group-shares: {err}", file=sys.stderr)
        return 2
    config = PolicyConfig(demote_after_gpu_s=time_slice)
    oracle = args.estimates == "oracle"
    policy = Policy(args.policy or "towerq")
    elastic = args.elastic or 0.0
    result = simulate(
        jobs, args.hosts, args.gpus_per_host, policy, oracle=oracle, config=config, group_shares=shares, elastic=elastic
    )
    print(json.dumps(result))
    return 0


def _simulate_from_db(args: argparse.Namespace) -> int:
    """The lab's own jobs: exported as a trace, or replayed as the lab is and with the
    options given, printed side by side as one JSON object."""
    import csv
    import json
    import sys
    from datetime import UTC, datetime

    from service.core.db import Database
    from service.lab.whatif import lab_trace, what_if
    from service.scheduler.types import Policy
    from towerq.cli.reports import when_from
    from towerq.cli.session import UsageError

    try:
        since = datetime.fromisoformat(when_from(args.since, "--since"))
        until = datetime.fromisoformat(when_from(args.until, "--until")) if args.until else datetime.now(UTC)
    except UsageError as err:
        print(f"towerq: {err}", file=sys.stderr)
        return 2
    if since >= until:
        print("towerq: --since must be before --until", file=sys.stderr)
        return 2
    settings = Settings()
    db = Database(settings.database_url)
    try:
        with db.read() as session:
            if args.export is not None:
                trace = lab_trace(session, since, until)
                with args.export.open("w", newline="") as handle:
                    out = csv.writer(handle)
                    out.writerow(
                        ["submit_time_s", "duration_s", "num_gpus", "user", "gpu_fraction", "time_limit_s", "group"]
                    )
                    for job in trace.jobs:
                        limit = "" if job.limit is None else f"{job.limit:g}"
                        out.writerow(
                            [
                                f"{job.submit:.3f}",
                                f"{job.duration:.3f}",
                                job.gpu_count,
                                job.user,
                                f"{job.fraction:g}",
                                limit,
                                job.group or "",
                            ]
                        )
                print(f"{len(trace.jobs)} jobs written to {args.export} ({trace.never_ran} never ran: left out)")
                return 0
            changes = {
                "hosts": args.hosts,
                "gpus_per_host": args.gpus_per_host,
                "policy": Policy(args.policy) if args.policy else None,
                "time_slice_gpu_s": args.time_slice,
                "elastic": args.elastic,
            }
            result = what_if(session, settings, since, until, {k: v for k, v in changes.items() if v is not None})
    finally:
        db.dispose()
    if args.output_format == "json":
        print(json.dumps(result, default=str))
    else:
        print("\n".join(what_if_table(result)))
    return 0


WHAT_IF_ROWS = (
    ("avg_jct_s", "avg job completion"),
    ("user_avg_jct_s", "avg, each user once"),
    ("p95_jct_s", "p95 job completion"),
    ("avg_wait_s", "avg wait"),
    ("p95_wait_s", "p95 wait"),
    ("max_wait_s", "max wait"),
    ("utilization", "GPUs busy"),
)


def what_if_table(result: dict[str, Any]) -> list[str]:
    """`towerq simulate --from-db` as the What-if page shows it: the lab as it is beside the
    options given, their ratio, and each user's p95 wait."""
    from towerq.cli.views import duration_text

    now, other = result["now"], result["what_if"]

    def setup(replay: dict[str, Any]) -> str:
        s = replay["setup"]
        slicing = f"slice {s['time_slice_gpu_s'] / 3600:g} GPU-h" if s["time_slice_gpu_s"] else "no slicing"
        return f"{s['hosts']} x {s['gpus_per_host']} GPUs, {s['policy']}, {slicing}"

    def figure(key: str, value: float) -> str:
        return f"{100 * value:.1f}%" if key == "utilization" else duration_text(value)

    left = f"; {result['never_ran']} that never held a GPU left out" if result["never_ran"] else ""
    lines = [
        f"{result['jobs']} jobs, {now['gpu_hours']:.1f} GPU-hours of work{left}",
        f"  as now:  {setup(now)}",
        f"  what if: {setup(other)}",
        "",
        f"{'':<20} {'AS NOW':>12} {'WHAT IF':>12} {'RATIO':>7}",
    ]
    for key, label in WHAT_IF_ROWS:
        ratio = f"{other[key] / now[key]:.2f}x" if now[key] else "-"
        lines.append(f"{label:<20} {figure(key, now[key]):>12} {figure(key, other[key]):>12} {ratio:>7}")
    lines += ["", f"{'USER':<20} {'GPU-HOURS':>12} {'P95 WAIT NOW':>14} {'WHAT IF':>12}"]
    for user, row in sorted(now["per_user"].items(), key=lambda item: -item[1]["gpu_hours"]):
        waits = duration_text(row["p95_wait_s"]), duration_text(other["per_user"].get(user, {}).get("p95_wait_s", 0.0))
        lines.append(f"{user[:20]:<20} {row['gpu_hours']:>12.1f} {waits[0]:>14} {waits[1]:>12}")
    return lines
