"""Admin commands: the first admin (`admin bootstrap`, on the service's database), and tokens and
users, through the API where the command line is logged in, else on the database."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from service.core.db import Database, require_schema
from service.core.models import ApiToken, User
from service.core.settings import Settings
from service.core.tokenfile import write_secret
from service.lab.auth import USER_NAME_PATTERN, bootstrap_admin, create_token, revoke_token
from towerq.cli.session import connection_options
from towerq.client import Client
from towerq.contract.spec import Priority


def add_commands(commands: Any) -> None:
    admin = commands.add_parser("admin", help="set up a deployment")
    admin_actions = admin.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    bootstrap = admin_actions.add_parser(
        "bootstrap", help="create the first admin token, once (does nothing when an admin exists)"
    )
    bootstrap.add_argument("--user", default="admin", help="the admin's user name (default admin)")
    bootstrap.add_argument("--token-file", type=Path, default=None, help="also save the token here (mode 0600)")
    bootstrap.add_argument(
        "--url", default=None, help="the dashboard's address in the login link (default TOWERQ_PUBLIC_URL)"
    )
    bootstrap.set_defaults(run=run_admin_bootstrap)

    token = commands.add_parser("token", help="API tokens")
    actions = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token (and the user, if needed); prints it last")
    create.add_argument("--user", required=True)
    create.add_argument("--admin", action="store_true", help="make the user an admin")
    create.add_argument("--name", default="", help="a label for the token")
    create.set_defaults(run=run_token_create)
    revoke = actions.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(run=run_token_revoke)
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    listing.set_defaults(run=run_token_list)
    for command in (create, revoke, listing):
        connection_options(command)

    user = commands.add_parser("user", help="users")
    user_actions = user.add_subparsers(dest="user_command", required=True, metavar="ACTION")
    users = user_actions.add_parser("list", help="list users")
    users.set_defaults(run=run_user_list)
    update = user_actions.add_parser("set", help="change a user's limits, share or admin flag")
    update.add_argument("name")
    update.add_argument("--gpu-limit", type=int, default=None, help="GPUs in use at once (0 = the default limit)")
    update.add_argument("--share", type=float, default=None, help="fair-share weight (default 1)")
    update.add_argument(
        "--max-priority",
        choices=[p.value for p in Priority],
        default=None,
        help="the highest priority the user may use",
    )
    update.add_argument("--admin", dest="admin", action="store_true", default=None)
    update.add_argument("--no-admin", dest="admin", action="store_false")
    update.set_defaults(run=run_user_set)
    for command in (users, update):
        connection_options(command)


def _database() -> Database:
    url = Settings().database_url
    require_schema(url)
    return Database(url)


def run_admin_bootstrap(args: argparse.Namespace) -> int:
    _check_user_name(args.user)
    settings = Settings()
    db = _database()
    try:
        with db.write() as session:
            secret = bootstrap_admin(session, args.user, label="created by towerq admin bootstrap")
    finally:
        db.dispose()
    if secret is None:
        print(
            "towerq: an admin with a live token exists already; nothing to do "
            "(`towerq token create --user NAME --admin` makes another)"
        )
        return 0
    if args.token_file is not None:
        write_secret(args.token_file, secret)
    url = (args.url or settings.public_url or settings.api_url).rstrip("/")
    saved = f"; also saved in {args.token_file}" if args.token_file is not None else ""
    print(f"towerq: created the first admin, user {args.user!r}")
    print(f"  log in:  {url}/#token={secret}")  # a fragment: never sent to a server
    print(f"  admin token (shown once{saved}):")
    print(f"  {secret}", flush=True)
    return 0


def _check_user_name(name: str) -> None:
    import re

    if not re.match(USER_NAME_PATTERN, name):
        raise SystemExit(f"towerq: invalid user name {name!r} (letters, digits, _ . @ -; at most 64)")


def logged_in(args: argparse.Namespace) -> Client | None:
    """The API, where the command line is logged in (`towerq login`, `TOWERQ_TOKEN`, or
    `--token`): token and user commands go through it, from any machine, as its caller; None:
    they work on this machine's database (the service's own, before anyone logged in)."""
    client = Client(url=args.api, token=args.token, retries=2)
    if client.config.token:
        return client
    client.close()
    return None


def run_token_create(args: argparse.Namespace) -> int:
    _check_user_name(args.user)
    client = logged_in(args)
    if client is not None:
        with client:
            made = client.create_token(args.user, admin=args.admin, name=args.name)
        role = " (an admin)" if args.admin else ""
        print(f"token {made['id']} for {args.user}{role} (store it now: it is not shown again)")
        print(made["token"])
        return 0
    db = _database()
    with db.write() as session:
        row, secret = create_token(session, args.user, admin=args.admin, label=args.name)
        role = "admin" if row.user.is_admin else "user"
        print(f"token {row.id} for {role} {args.user} (store it now: it is not shown again)")
    print(secret)
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    client = logged_in(args)
    if client is not None:
        with client:
            row = client.revoke_token(args.id)
        print(f"token {row['id']} ({row['prefix']}…) revoked")
        return 0
    db = _database()
    with db.write() as session:
        revoked = revoke_token(session, args.id)
        print(f"token {revoked.id} ({revoked.prefix}…) revoked")
    return 0


TokenRow = tuple[int, str, str, str, datetime, datetime | None]
"""id, user, prefix, label, created, revoked (None: active)."""


def run_token_list(args: argparse.Namespace) -> int:
    client = logged_in(args)
    if client is not None:
        with client:
            said = client.tokens()
        rows: list[TokenRow] = [
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
    else:
        db = _database()
        with db.read() as session:
            found = session.execute(
                select(ApiToken, User.name).join(User, ApiToken.user_id == User.id).order_by(ApiToken.id)
            )
            rows = [(t.id, name, t.prefix, t.name, t.created_at, t.revoked_at) for t, name in found]
    print(f"{'ID':>4}  {'USER':<16} {'PREFIX':<12} {'LABEL':<24} {'CREATED':<20} STATUS")
    for token_id, name, prefix, label, created_at, revoked_at in rows:
        status = f"revoked {revoked_at:%Y-%m-%d %H:%M}" if revoked_at else "active"
        created = f"{created_at:%Y-%m-%d %H:%M}"
        print(f"{token_id:>4}  {name:<16} {prefix + '…':<12} {label[:24]:<24} {created:<20} {status}")
    return 0


def _when(said: str) -> datetime:
    """A time as the API says it (ISO 8601), in UTC as the database gives it."""
    return datetime.fromisoformat(said).astimezone(UTC)


def run_user_list(args: argparse.Namespace) -> int:
    client = logged_in(args)
    if client is not None:
        with client:
            users = [(u["name"], u["is_admin"], u["gpu_limit"], u["share"]) for u in client.users()]
    else:
        db = _database()
        with db.read() as session:
            found = session.scalars(select(User).order_by(User.name))
            users = [(u.name, u.is_admin, u.gpu_limit, u.share) for u in found]
    print(f"{'USER':<20} {'ADMIN':<6} {'GPU LIMIT':<10} SHARE")
    for name, is_admin, gpu_limit, share in users:
        limit = str(gpu_limit) if gpu_limit is not None else "default"
        print(f"{name:<20} {'yes' if is_admin else 'no':<6} {limit:<10} {share:g}")
    return 0


def run_user_set(args: argparse.Namespace) -> int:
    if args.share is not None and args.share <= 0:
        raise SystemExit("towerq: --share must be positive")
    change = {
        key: value
        for key, value in (
            ("gpu_limit", args.gpu_limit),
            ("share", args.share),
            ("is_admin", args.admin),
            ("max_priority", args.max_priority),
        )
        if value is not None
    }
    client = logged_in(args)
    if client is not None:
        with client:
            user = client.change_user(args.name, **change)
        _print_user(user["name"], user["is_admin"], user["gpu_limit"], user["share"], user["max_priority"])
        return 0
    db = _database()
    with db.write() as session:
        row = session.scalars(select(User).where(User.name == args.name)).one_or_none()
        if row is None:
            raise SystemExit(f"towerq: no user {args.name!r}")
        if "gpu_limit" in change:
            row.gpu_limit = args.gpu_limit or None
        for key in ("share", "is_admin", "max_priority"):
            if key in change:
                setattr(row, key, change[key])
        _print_user(row.name, row.is_admin, row.gpu_limit, row.share, row.allowed_priority)
    return 0


def _print_user(name: str, is_admin: bool, gpu_limit: int | None, share: float, max_priority: str) -> None:
    admin = "yes" if is_admin else "no"
    print(f"{name}: admin={admin} gpu_limit={gpu_limit or 'default'} share={share:g} max_priority={max_priority}")
