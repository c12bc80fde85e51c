"""`towerq group`: the lab's groups, their shares, quotas and members (changes: admins)."""

from __future__ import annotations

import argparse
from typing import Any

from towerq.cli.session import Api, UsageError, print_json

NO_LIMIT = "none"


def add_group_commands(commands: Any) -> None:
    group = commands.add_parser("group", help="groups: list; create, set, delete, add, remove (admins)")
    actions = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
        sub.add_argument("--api", default=None, help="API URL (default TOWERQ_API_URL)")
        sub.add_argument("--token", default=None, help="API token (default TOWERQ_TOKEN or `towerq login`)")
        return sub

    listing = action("list", "every group: share, quotas, GPU hours in the last 7 days, members")
    listing.add_argument("-o", "--output", dest="output_format", choices=("table", "json"), default="table")
    listing.set_defaults(run=run_group_list)
    for name, help_text in (
        ("create", "create a group (its share weighs it against the other groups)"),
        ("set", "change a group's share or quotas (`none` takes a quota away)"),
    ):
        sub = action(name, help_text)
        sub.add_argument("name", help="lower-case letters, digits, - and _")
        sub.add_argument("--share", type=float, default=None, help="its weight (default 1)")
        sub.add_argument("--max-gpus", default=None, metavar="N", help="at most N GPUs at once (or none)")
        sub.add_argument(
            "--max-gpu-hours", default=None, metavar="H", help="at most H GPU hours in any 7 days (or none)"
        )
        sub.set_defaults(run=run_group_change, creating=name == "create")
    delete = action("delete", "delete a group none of whose jobs waits or runs")
    delete.add_argument("name")
    delete.set_defaults(run=run_group_delete)
    add = action("add", "put a user in a group")
    add.add_argument("name")
    add.add_argument("user")
    add.add_argument("--default", action="store_true", help="their jobs run in this group when they name none")
    add.set_defaults(run=run_group_add)
    remove = action("remove", "take a user out of a group (their jobs in it keep it)")
    remove.add_argument("name")
    remove.add_argument("user")
    remove.set_defaults(run=run_group_remove)


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
    if args.output_format == "json":
        return print_json(groups)
    if not groups:
        print("no groups yet (an admin creates one: towerq group create NAME --share N)")
        return 0
    print("\n".join(group_lines(groups)))
    return 0


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
