"""`towerq group` and `towerq reservation`: the lab's groups (shares, quotas, members) and
the GPUs kept for them over a window (changes: admins)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from towerq.cli.session import Api, UsageError, connection_options, moment, output_option, print_json

NO_LIMIT = "none"


def add_group_commands(commands: Any) -> None:
    group = commands.add_parser("group", help="groups: list; create, set, delete, add, remove (admins)")
    actions = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")

    listing = _action(actions, "list", "every group: share, quotas, GPU hours in the last 7 days, members")
    output_option(listing)
    listing.set_defaults(run=run_group_list)
    for name, help_text in (
        ("create", "create a group (its share weighs it against the other groups)"),
        ("set", "change a group's share or quotas (`none` takes a quota away)"),
    ):
        sub = _action(actions, name, help_text)
        sub.add_argument("name", help="lower-case letters, digits, - and _")
        sub.add_argument("--share", type=float, default=None, help="its weight (default 1)")
        sub.add_argument(
            "--max-gpus", "--gpu-quota", dest="max_gpus", default=None, metavar="N",
            help="at most N GPUs at once (or none)",
        )  # fmt: skip
        sub.add_argument(
            "--max-gpu-hours", default=None, metavar="H", help="at most H GPU hours in any 7 days (or none)"
        )
        sub.set_defaults(run=run_group_change, creating=name == "create")
    delete = _action(actions, "delete", "delete a group none of whose jobs waits or runs")
    delete.add_argument("name")
    delete.set_defaults(run=run_group_delete)
    add = _action(actions, "add", "put a user in a group")
    add.add_argument("name")
    add.add_argument("user")
    add.add_argument("--default", action="store_true", help="their jobs run in this group when they name none")
    add.set_defaults(run=run_group_add)
    remove = _action(actions, "remove", "take a user out of a group (their jobs in it keep it)")
    remove.add_argument("name")
    remove.add_argument("user")
    remove.set_defaults(run=run_group_remove)


def _action(actions: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
    connection_options(sub)
    return sub


def add_reservation_commands(commands: Any) -> None:
    reservation = commands.add_parser(
        "reservation", help="GPUs kept for a group over a window: list; create, delete (admins)"
    )
    actions = reservation.add_subparsers(dest="reservation_command", required=True, metavar="ACTION")

    listing = _action(actions, "list", "the reservations not yet over, soonest first")
    listing.add_argument("--all", action="store_true", help="those already over too")
    output_option(listing)
    listing.set_defaults(run=run_reservation_list)
    create = _action(actions, "create", "keep GPUs for a group from --start to --end")
    create.add_argument("--group", required=True)
    create.add_argument("--gpus", type=int, required=True, help="how many GPUs")
    create.add_argument(
        "--start", default="now", help="a time of day (22:00: its next one), now, +2h / +1d, or an ISO time (local)"
    )
    create.add_argument(
        "--end", required=True, help="a time of day (08:00: its next one after --start), +8h / +2d from --start, or ISO"
    )
    create.add_argument("--host", default=None, help="keep GPUs of this host only")
    create.add_argument("--note", default="", help="what it is for")
    create.set_defaults(run=run_reservation_create)
    delete = _action(actions, "delete", "end a reservation now, or take back one not begun")
    delete.add_argument("id", type=int)
    delete.set_defaults(run=run_reservation_delete)


def _local(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone().strftime("%a %d %b %H:%M")


def reservation_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'ID':>4} {'GROUP':<12} {'GPUS':>4} {'FROM':<16} {'TO':<16} {'STATE':<8} WHERE / NOTE"]
    for r in rows:
        hosts: dict[str, list[str]] = {}
        for gpu in r["gpus"]:
            hosts.setdefault(gpu["host"], []).append(str(gpu["index"]))
        where = "; ".join(f"{host} {','.join(indices)}" for host, indices in hosts.items())
        state = "active" if r["active"] else ("over" if r["end_at"] < datetime.now(UTC).isoformat() else "ahead")
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(
            f"{r['id']:>4} {r['group'][:12]:<12} {len(r['gpus']):>4} {_local(r['start_at']):<16} "
            f"{_local(r['end_at']):<16} {state:<8} {where}{note}"
        )
    return lines


def _listing(args: argparse.Namespace, rows: list[dict[str, Any]], lines: list[str], empty: str) -> int:
    """A list command's output: the API's answer as JSON, `empty` when there is nothing, or the table."""
    if args.output_format == "json":
        return print_json(rows)
    print("\n".join(lines) if rows else empty)
    return 0


def run_reservation_list(args: argparse.Namespace) -> int:
    rows = Api(args).client.reservations(args.all)
    empty = "no reservations ahead (an admin makes one: towerq reservation create --group G --gpus N --end +8h)"
    return _listing(args, rows, reservation_lines(rows), empty)


def run_reservation_create(args: argparse.Namespace) -> int:
    if args.gpus < 1:
        raise UsageError("--gpus must be at least 1")
    start = moment(args.start, "--start")
    end = moment(args.end, "--end", after=start)
    fields = {"note": args.note} | ({"host": args.host} if args.host else {})
    made = Api(args).client.reserve(args.group, args.gpus, start.isoformat(), end.isoformat(), **fields)
    print("\n".join(reservation_lines([made])))
    for holder in made["held_past_start"]:
        ends = f"its time limit ends it {_local(holder['ends_at'])}" if holder["ends_at"] else "it has no time limit"
        print(
            f"note: job {holder['job_id']} runs on {holder['host']} GPU {holder['gpu']} and may still run at the "
            f"start ({ends}); {args.group} may wait for it"
        )
    return 0


def run_reservation_delete(args: argparse.Namespace) -> int:
    gone = Api(args).client.delete_reservation(args.id)
    print(f"reservation {gone['id']} for {gone['group']} deleted: its GPUs are everyone's again")
    return 0


def _limit(text: str | None, option: str) -> float | None:
    if text is None or text == NO_LIMIT:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{option} takes a number or `none`, not {text!r}") from None
    if value <= 0:
        raise UsageError(f"{option} must be above 0 (or `none` for no quota)")
    return value


def _quota(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def group_lines(groups: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'GROUP':<16} {'SHARE':>6} {'MAX GPUS':>9} {'GPU-H/WEEK':>16}  MEMBERS (* default)"]
    for g in groups:
        week = f"{g['gpu_hours_week']:.1f}" + (
            f" / {g['max_gpu_hours_week']:g}" if g["max_gpu_hours_week"] is not None else ""
        )
        members = ", ".join(m["user"] + ("*" if m["default"] else "") for m in g["members"]) or "-"
        lines.append(f"{g['name'][:16]:<16} {g['share']:>6g} {_quota(g['max_gpus']):>9} {week:>16}  {members}")
    return lines


def run_group_list(args: argparse.Namespace) -> int:
    groups = Api(args).client.groups()
    empty = "no groups yet (an admin creates one: towerq group create NAME --share N)"
    return _listing(args, groups, group_lines(groups), empty)


def run_group_change(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {}
    if args.share is not None:
        if args.share <= 0:
            raise UsageError("--share must be above 0")
        fields["share"] = args.share
    if args.max_gpus is not None:
        fields["max_gpus"] = _limit(args.max_gpus, "--max-gpus")
    if args.max_gpu_hours is not None:
        fields["max_gpu_hours_week"] = _limit(args.max_gpu_hours, "--max-gpu-hours")
    client = Api(args).client
    if args.creating:
        made = client.create_group(args.name, **{k: v for k, v in fields.items() if v is not None})
        print("\n".join(group_lines([made])))
        return 0
    if not fields:
        raise UsageError("nothing to change: give --share, --max-gpus or --max-gpu-hours")
    print("\n".join(group_lines([client.change_group(args.name, **fields)])))
    return 0


def run_group_delete(args: argparse.Namespace) -> int:
    Api(args).client.delete_group(args.name)
    print(f"group {args.name} deleted")
    return 0


def run_group_add(args: argparse.Namespace) -> int:
    print("\n".join(group_lines([Api(args).client.add_to_group(args.name, args.user, args.default)])))
    return 0


def run_group_remove(args: argparse.Namespace) -> int:
    print("\n".join(group_lines([Api(args).client.remove_from_group(args.name, args.user)])))
    return 0
