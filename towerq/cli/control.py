"""Changing jobs from the command line: `towerq cancel` (one job, several, or every one of a
member's in some states, as Slurm's `scancel -u USER -t PENDING`), `towerq hold` and
`towerq release` (as `scontrol hold` and `release`), `towerq update` (a name; a queued job's
priority and time limit, as `scontrol update`), `towerq share`, `towerq webhooks` (a job's
deliveries; a failed one sent again)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from towerq.cli import views
from towerq.cli.run import begun
from towerq.cli.session import PRIORITIES, Api, ClientError, UsageError, duration, print_json
from towerq.client import Client, Job
from towerq.contract.times import limit_text
from towerq.errors import ApiError, AuthError

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

    for name, help_text in (
        ("hold", "put queued jobs (on Slurm, pending ones) on hold: they wait until released (towerq release)"),
        ("release", "release jobs on hold: they queue again, as if they had waited only while not held"),
    ):
        sub = command(name, help_text)
        sub.add_argument("ids", type=int, nargs="*", metavar="ID", help="the jobs' ids")
        whose = "queued" if name == "hold" else "on hold"
        sub.add_argument("--all", action="store_true", help=f"every job of yours {whose} (with --user, that user's)")
        sub.add_argument("--user", default=None, help=f"every job of this user {whose} (admins: anyone's)")
        sub.set_defaults(run=run_hold if name == "hold" else run_release)

    update = command(
        "update", "change a job: its name; while queued, its priority and begin; its time limit until it ends"
    )
    update.add_argument("id", type=int)
    update.add_argument("--name", default=None)
    update.add_argument("--priority", choices=PRIORITIES, default=None)
    update.add_argument(
        "--time-limit", type=duration, default=None, metavar="DURATION",
        help=(
            "stop it after this long once it runs: 2h, 90m, 1:30:00 (a number alone: seconds); a running job's "
            "counts from its start (only admins lengthen a started job's)"
        ),
    )  # fmt: skip
    update.add_argument(
        "--begin", default=None, metavar="WHEN",
        help="a queued job that never ran starts no earlier than this: 22:00, +2h, an ISO time; now: at once",
    )  # fmt: skip
    update.set_defaults(run=run_update)

    share = command("share", "let every member read a job's log, artifacts and code (--private: only you again)")
    share.add_argument("id", type=int)
    share.add_argument("--private", action="store_true", help="only you and the admins (a new job's default)")
    share.set_defaults(run=run_share)

    webhooks = command(
        "webhooks", "a job's webhook deliveries; --resend N sends a failed one again (its owner or an admin)", read=True
    )
    webhooks.add_argument("id", type=int)
    webhooks.add_argument(
        "--resend", type=int, default=None, metavar="N",
        help="send delivery N again (the same body and number), once its receiver is mended",
    )  # fmt: skip
    webhooks.set_defaults(run=run_webhooks)


def run_cancel(args: argparse.Namespace) -> int:
    client = Api(args).client
    filters = "--state queued, or --user NAME"
    ids = picked(client, args, filters, bool(args.state or args.user), args.state or UNFINISHED)
    if not ids:
        return nothing(args, " or ".join(args.state or UNFINISHED), "cancelled")

    def said(job: Job) -> str:
        return f"job {job.id}: {job.state}" + (" (stop requested)" if job.state in ("dispatched", "running") else "")

    return each(ids, client.cancel, said, "cancelled", not args.ids)


def waiting(me: dict[str, Any]) -> list[str]:
    """The states towerq hold and release pick by filter: queued jobs, and where the lab
    hands its jobs to a cluster that places them (Slurm) the dispatched ones, which wait
    there and can be held. Elsewhere a dispatched job is starting on its GPUs and cannot be
    held, so it is left out (an API without `places_jobs` places its own: GPU hosts)."""
    return ["queued"] if me.get("places_jobs", True) else ["queued", "dispatched"]


def run_hold(args: argparse.Namespace) -> int:
    client = Api(args).client
    ids = picked(client, args, "--all, or --user NAME", bool(args.all or args.user), waiting)
    if not ids:
        return nothing(args, "queued", "put on hold")
    said = "job {0}: on hold (towerq release {0} lets it start)"
    return each(ids, client.hold, lambda job: said.format(job.id), "put on hold", not args.ids)


def run_release(args: argparse.Namespace) -> int:
    client = Api(args).client
    ids = picked(client, args, "--all, or --user NAME", bool(args.all or args.user), waiting, on_hold=True)
    if not ids:
        return nothing(args, "on hold", "released")
    return each(ids, client.release, lambda job: f"job {job.id}: released, {job.state}", "released", not args.ids)


def picked(
    client: Client,
    args: argparse.Namespace,
    filters: str,
    filtered: bool,
    states: Sequence[str] | Callable[[dict[str, Any]], Sequence[str]],
    on_hold: bool = False,
) -> list[int]:
    """The jobs a command acts on: its ids, else those its filters choose (`chosen`): the
    caller's own, another member's (`--user`) for admins only; `states` may depend on the
    lab (`GET /api/me`)."""
    if args.ids and filtered:
        raise UsageError(f"give job ids, or {filters}, not both")
    if args.ids:
        return list(dict.fromkeys(args.ids))
    if not filtered:
        raise UsageError(f"name the jobs: towerq {args.command} ID [ID ...], or {filters}")
    me = client.me()
    if args.user and args.user != me["user"] and not me["is_admin"]:
        raise ClientError(f"only admins {args.command} another member's jobs: you are {me['user']}")
    if callable(states):
        states = states(me)
    return chosen(client, states, args.user or str(me["user"]), on_hold)


def chosen(client: Client, states: Sequence[str], owner: str, on_hold: bool = False) -> list[int]:
    """The ids of `owner`'s jobs in `states` (`on_hold`: only those on hold), oldest first;
    all read before any is acted on, page by page."""
    found: dict[int, bool] = {}
    while True:
        page = client.jobs_page(state=list(states), user=owner, limit=PAGE, offset=len(found))
        for item in page["items"]:
            found[int(item["id"])] = bool(item.get("on_hold_by"))
        if len(page["items"]) < PAGE:
            return sorted(job_id for job_id, held in found.items() if held or not on_hold)


def nothing(args: argparse.Namespace, what: str, done: str) -> int:
    whose = f"{args.user}'s" if args.user else "yours"
    print(f"no job of {whose} is {what}: nothing {done}")
    return 0


def each(ids: list[int], act: Callable[[int], Job], said: Callable[[Job], str], done: str, chosen: bool) -> int:
    """`act` on each job in turn, a line each (`said`); one the API refuses (ended already,
    not yours, not there) is said on stderr and the others go on (exit 1). Jobs `chosen` by
    the command's filters (--all, --user, --state) were read a moment before: one that moved
    on meanwhile (409: it started, ended, or was released) is skipped, said on stdout, and
    fails nothing, as it was no longer what the filter asked for."""
    refused = skipped = 0
    for job_id in ids:
        try:
            job = act(job_id)
        except AuthError:  # no job's refusal: the command's (exit 4)
            raise
        except ApiError as err:  # its message names the job: "job 9 is already succeeded"
            if chosen and err.status == 409:
                print(f"skipped: {err.detail}", flush=True)
                skipped += 1
                continue
            print(f"towerq: {err.detail}", file=sys.stderr, flush=True)
            refused += 1
            continue
        print(said(job), flush=True)
    if len(ids) > 1:
        tail = (f", {skipped} skipped" if skipped else "") + (f", {refused} refused" if refused else "")
        print(f"{len(ids) - refused - skipped} of {len(ids)} jobs {done}{tail}")
    return 1 if refused else 0


def run_update(args: argparse.Namespace) -> int:
    if args.name is None and args.priority is None and args.time_limit is None and args.begin is None:
        raise UsageError("say what changes: --name, --priority, --time-limit or --begin")
    job = Api(args).client.change(
        args.id, name=args.name, priority=args.priority, time_limit_s=args.time_limit, begin_at=begun(args)
    )
    print(f"job {job.id} ({job.name}), {job.state}: {changed(job, args)}")
    return 0


def changed(job: Job, args: argparse.Namespace) -> str:
    said = []
    if args.name is not None:
        said.append(f"named {job.name}")
    if args.priority is not None:
        said.append(f"priority {job.data['priority']}")
    if args.time_limit is not None:
        said.append(f"time limit {limit_text(job.data['spec'].get('time_limit_s'))}")
    if args.begin is not None:
        said.append(f"not before {views.local_clock(job.data['spec']['begin_at'])}")
    return ", ".join(said)


def run_share(args: argparse.Namespace) -> int:
    job = Api(args).client.share(args.id, "private" if args.private else "lab")
    whom = "only you and the admins" if args.private else "every member"
    print(f"job {job.id}: its log, artifacts and code are readable by {whom}")
    return 0


def run_webhooks(args: argparse.Namespace) -> int:
    client = Api(args).client
    job = client.resend_webhook(args.id, args.resend) if args.resend is not None else client.job(args.id)
    if args.output_format == "json":
        return print_json(job.data["notifications"])
    if args.resend is not None:
        sent = next(n for n in job.data["notifications"] if n["id"] == args.resend)
        print(f"job {job.id}: webhook #{sent['id']} ({sent['event']}) sent again")
        return 0
    lines = views.webhook_lines(job.data)
    if job.done:
        none = f"job {job.id}: no webhook (it names no notify_url, and the lab sets no TOWERQ_WEBHOOK_URL)"
    else:
        none = f"job {job.id}: no webhook yet (one goes when it ends or its GPUs idle, to its notify_url or the lab's)"
    print("\n".join(lines) if lines else none)
    return 0
