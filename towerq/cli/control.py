"""Changing jobs from the command line: `towerq cancel` (one job, several, or every one of a
member's in some states, as Slurm's `scancel -u USER -t PENDING`), `towerq update` (a name;
a queued job's priority and time limit, as `scontrol update`), `towerq share`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from towerq.cli import views
from towerq.cli.session import Api, ClientError, UsageError, duration
from towerq.client import Client, Job
from towerq.errors import ApiError

UNFINISHED = ("queued", "dispatched", "running")
PAGE = 500  # the API's largest page of jobs


def add_control_commands(command: Any) -> None:
    cancel = command(
        "cancel", "cancel jobs: by id, or every one of yours in a --state (a member's with --user: admins)"
    )
    cancel.add_argument("ids", type=int, nargs="*", metavar="ID", help="the jobs' ids")
    cancel.add_argument(
        "--state", action="append", choices=UNFINISHED, default=None,
        help="every job of yours in this state (repeat for several; with --user, that user's)",
    )  # fmt: skip
    cancel.add_argument("--user", default=None, help="every unfinished job of this user (admins: anyone's)")
    cancel.set_defaults(run=run_cancel)

    update = command("update", "change a job: its name; while it is queued, its priority and time limit")
    update.add_argument("id", type=int)
    update.add_argument("--name", default=None)
    update.add_argument("--priority", choices=("low", "normal", "high"), default=None)
    update.add_argument(
        "--time-limit", type=duration, default=None, metavar="DURATION",
        help="stop it after this long once it runs: 2h, 90m, 1:30:00 (a number alone: seconds)",
    )  # fmt: skip
    update.set_defaults(run=run_update)

    share = command("share", "let every member read a job's log, artifacts and code (--private: only you again)")
    share.add_argument("id", type=int)
    share.add_argument("--private", action="store_true", help="only you and the admins (a new job's default)")
    share.set_defaults(run=run_share)


def run_cancel(args: argparse.Namespace) -> int:
    """Each job in turn, a line each; a job that cannot be cancelled (ended already, not
    yours, not there) is said on stderr and the others are still cancelled (exit 1)."""
    if args.ids and (args.state or args.user):
        raise UsageError("give job ids, or --state / --user, not both")
    if not (args.ids or args.state or args.user):
        raise UsageError("name the jobs: towerq cancel ID [ID ...], or --state queued, or --user NAME")
    client = Api(args).client
    if args.user and not args.ids:
        me = client.me()
        if args.user != me["user"] and not me["is_admin"]:
            raise ClientError(f"only admins cancel another member's jobs: you are {me['user']}")
    ids = args.ids or chosen(client, args.state, args.user)
    if not ids:
        whose = f"{args.user}'s" if args.user else "yours"
        print(f"no job of {whose} is {' or '.join(args.state or UNFINISHED)}: nothing cancelled")
        return 0
    refused = 0
    for job_id in dict.fromkeys(ids):
        try:
            job = client.cancel(job_id)
        except ApiError as err:  # its message names the job: "job 9 is already succeeded"
            print(f"towerq: {err.detail}", file=sys.stderr, flush=True)
            refused += 1
            continue
        stopping = " (stop requested)" if job.state in ("dispatched", "running") else ""
        print(f"job {job.id}: {job.state}{stopping}", flush=True)
    if len(ids) > 1:
        print(f"{len(ids) - refused} of {len(ids)} jobs cancelled" + (f", {refused} refused" if refused else ""))
    return 1 if refused else 0


def chosen(client: Client, states: list[str] | None, user: str | None) -> list[int]:
    """The ids of `user`'s jobs (default: the caller's own) in `states` (default: every
    unfinished one), oldest first; read before any is cancelled, page by page."""
    owner = user or str(client.me()["user"])
    found: dict[int, None] = {}
    while True:
        page = client.jobs_page(state=list(states or UNFINISHED), user=owner, limit=PAGE, offset=len(found))
        for item in page["items"]:
            found[int(item["id"])] = None
        if len(page["items"]) < PAGE:
            return sorted(found)


def run_update(args: argparse.Namespace) -> int:
    if args.name is None and args.priority is None and args.time_limit is None:
        raise UsageError("say what changes: --name, --priority or --time-limit")
    job = Api(args).client.change(args.id, name=args.name, priority=args.priority, time_limit_s=args.time_limit)
    print(f"job {job.id} ({job.name}), {job.state}: {changed(job, args)}")
    return 0


def changed(job: Job, args: argparse.Namespace) -> str:
    said = []
    if args.name is not None:
        said.append(f"named {job.name}")
    if args.priority is not None:
        said.append(f"priority {job.data['priority']}")
    if args.time_limit is not None:
        said.append(f"time limit {views.duration_text(job.data['spec'].get('time_limit_s'))}")
    return ", ".join(said)


def run_share(args: argparse.Namespace) -> int:
    job = Api(args).client.share(args.id, "private" if args.private else "lab")
    whom = "only you and the admins" if args.private else "every member"
    print(f"job {job.id}: its log, artifacts and code are readable by {whom}")
    return 0
