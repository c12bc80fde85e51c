"""`towerq simulate`: a job trace, or the lab's own ended jobs (`--from-db`), replayed
through a scheduling policy, as it is and what if (`service.scheduler.simulate`,
`service.lab.whatif`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from service.core.settings import Settings
from service.scheduler.types import Policy


def add_commands(commands: Any) -> None:
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

    from service.scheduler.simulate import simulate
    from service.scheduler.trace import TraceError, read_trace
    from service.scheduler.types import PolicyConfig

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
    from datetime import UTC, datetime

    from service.core.db import Database
    from service.lab.whatif import lab_trace, what_if
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
