"""`towerq token` and `towerq user`: tokens and users, through the API as the logged-in caller
(members make, list and revoke their own tokens; admins anyone's, and set users' limits).
Where the command line is not logged in, the server's install does the same on the service's
database (`service.cli.admin`, the service's own machine before anyone logged in); the client
alone says to log in."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from towerq.cli.session import ClientError, connection_options
from towerq.client import Client
from towerq.contract.spec import Priority

OnDatabase = Callable[[argparse.Namespace], int]
"""A command done on the service's database instead (the server's install), by its name
(`"token create"`)."""

TokenRow = tuple[int, str, str, str, datetime, datetime | None]
"""id, user, prefix, label, created, revoked (None: active)."""
UserRow = tuple[str, bool, int | None, float]
"""name, admin, GPU limit (None: the lab's), share."""


def add_people_commands(commands: Any, on_database: dict[str, OnDatabase] | None = None) -> None:
    done_there = on_database or {}
    token = commands.add_parser("token", help="API tokens: yours, or anyone's for admins")
    actions = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token (and the user, if needed); prints it last")
    create.add_argument("--user", required=True)
    create.add_argument("--admin", action="store_true", help="make the user an admin")
    create.add_argument("--name", default="", help="a label for the token")
    create.set_defaults(run=either, on_api=token_create, on_database=done_there.get("token create"))
    revoke = actions.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(run=either, on_api=token_revoke, on_database=done_there.get("token revoke"))
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    listing.set_defaults(run=either, on_api=token_list, on_database=done_there.get("token list"))

    user = commands.add_parser("user", help="users and their limits (admins)")
    user_actions = user.add_subparsers(dest="user_command", required=True, metavar="ACTION")
    users = user_actions.add_parser("list", help="list users")
    users.set_defaults(run=either, on_api=user_list, on_database=done_there.get("user list"))
    new = user_actions.add_parser("create", help="a new user, with a first token (towerq token create --user NAME)")
    new.add_argument("user", metavar="name")
    new.add_argument("--admin", action="store_true", help="make the user an admin")
    new.add_argument("--name", default="", help="a label for the token")
    new.set_defaults(run=either, on_api=token_create, on_database=done_there.get("token create"))
    update = user_actions.add_parser("set", help="change a user's limits, share or admin flag")
    update.add_argument("name")
    update.add_argument("--gpu-limit", type=int, default=None, help="GPUs in use at once (0 = the default limit)")
    update.add_argument("--share", type=float, default=None, help="fair-share weight (default 1)")
    update.add_argument(
        "--max-priority", choices=[p.value for p in Priority], default=None,
        help="the highest priority the user may use",
    )  # fmt: skip
    update.add_argument("--admin", dest="admin", action="store_true", default=None)
    update.add_argument("--no-admin", dest="admin", action="store_false")
    update.set_defaults(run=either, on_api=user_set, on_database=done_there.get("user set"))
    for command in (create, revoke, listing, users, new, update):
        connection_options(command)


def logged_in(args: argparse.Namespace) -> Client | None:
    """The API, where the command line is logged in (`towerq login`, `TOWERQ_TOKEN`, or
    `--token`); None where it is not."""
    client = Client(url=args.api, token=args.token, retries=2)
    if client.config.token:
        return client
    client.close()
    return None


def either(args: argparse.Namespace) -> int:
    """The command through the API (`args.on_api`) where the command line is logged in;
    else on the service's database (`args.on_database`) where the server is installed."""
    client = logged_in(args)
    if client is None:
        if args.on_database is None:
            raise ClientError(
                "not logged in: `towerq login URL --token TOKEN` first (tokens and users go through the API)"
            )
        return int(args.on_database(args))
    with client:
        return int(args.on_api(client, args))


def token_create(client: Client, args: argparse.Namespace) -> int:
    made = client.create_token(args.user, admin=args.admin, name=args.name)
    role = " (an admin)" if args.admin else ""
    print(f"token {made['id']} for {args.user}{role} (store it now: it is not shown again)")
    print(made["token"])
    return 0


def token_revoke(client: Client, args: argparse.Namespace) -> int:
    row = client.revoke_token(args.id)
    print(f"token {row['id']} ({row['prefix']}…) revoked")
    return 0


def token_list(client: Client, args: argparse.Namespace) -> int:
    said = client.tokens()
    print_tokens(
        [
            (
                t["id"],
                t["user"],
                t["prefix"],
                t["name"],
                _when(t["created_at"]),
                _when(t["revoked_at"]) if t["revoked_at"] else None,
            )
            for t in said
        ]
    )
    return 0


def print_tokens(rows: list[TokenRow]) -> None:
    print(f"{'ID':>4}  {'USER':<16} {'PREFIX':<12} {'LABEL':<24} {'CREATED':<20} STATUS")
    for token_id, name, prefix, label, created_at, revoked_at in rows:
        status = f"revoked {revoked_at:%Y-%m-%d %H:%M}" if revoked_at else "active"
        created = f"{created_at:%Y-%m-%d %H:%M}"
        print(f"{token_id:>4}  {name:<16} {prefix + '…':<12} {label[:24]:<24} {created:<20} {status}")


def _when(said: str) -> datetime:
    """A time as the API says it (ISO 8601), in UTC as the database gives it."""
    return datetime.fromisoformat(said).astimezone(UTC)


def user_list(client: Client, args: argparse.Namespace) -> int:
    print_users([(u["name"], u["is_admin"], u["gpu_limit"], u["share"]) for u in client.users()])
    return 0


def print_users(users: list[UserRow]) -> None:
    print(f"{'USER':<20} {'ADMIN':<6} {'GPU LIMIT':<10} SHARE")
    for name, is_admin, gpu_limit, share in users:
        limit = str(gpu_limit) if gpu_limit is not None else "default"
        print(f"{name:<20} {'yes' if is_admin else 'no':<6} {limit:<10} {share:g}")


def user_change(args: argparse.Namespace) -> dict[str, Any]:
    """What `towerq user set` asks to change, by the API's names."""
    asked = {
        "gpu_limit": args.gpu_limit,
        "share": args.share,
        "is_admin": args.admin,
        "max_priority": args.max_priority,
    }
    return {key: value for key, value in asked.items() if value is not None}


def user_set(client: Client, args: argparse.Namespace) -> int:
    user = client.change_user(args.name, **user_change(args))
    print_user(user["name"], user["is_admin"], user["gpu_limit"], user["share"], user["max_priority"])
    return 0


def print_user(name: str, is_admin: bool, gpu_limit: int | None, share: float, max_priority: str) -> None:
    admin = "yes" if is_admin else "no"
    print(f"{name}: admin={admin} gpu_limit={gpu_limit or 'default'} share={share:g} max_priority={max_priority}")
