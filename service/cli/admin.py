"""Admin commands, run on a machine with access to the database: tokens and users."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sqlalchemy import select

from service.core.db import Database, require_schema
from service.core.models import ApiToken, User
from service.core.settings import Settings
from service.core.tokenfile import write_secret
from service.lab.auth import USER_NAME_PATTERN, bootstrap_admin, create_token, revoke_token
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
    actions.add_parser("list", help="list tokens (never their secrets)").set_defaults(run=run_token_list)

    user = commands.add_parser("user", help="users")
    user_actions = user.add_subparsers(dest="user_command", required=True, metavar="ACTION")
    user_actions.add_parser("list", help="list users").set_defaults(run=run_user_list)
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


def run_token_create(args: argparse.Namespace) -> int:
    _check_user_name(args.user)
    db = _database()
    with db.write() as session:
        row, secret = create_token(session, args.user, admin=args.admin, label=args.name)
        role = "admin" if row.user.is_admin else "user"
        print(f"token {row.id} for {role} {args.user} (store it now: it is not shown again)")
    print(secret)
    return 0


def run_token_revoke(args: argparse.Namespace) -> int:
    db = _database()
    with db.write() as session:
        row = revoke_token(session, args.id)
        print(f"token {row.id} ({row.prefix}…) revoked")
    return 0


def run_token_list(args: argparse.Namespace) -> int:
    db = _database()
    with db.read() as session:
        rows = session.execute(
            select(ApiToken, User.name).join(User, ApiToken.user_id == User.id).order_by(ApiToken.id)
        )
        print(f"{'ID':>4}  {'USER':<16} {'PREFIX':<12} {'LABEL':<24} {'CREATED':<20} STATUS")
        for token, name in rows:
            status = f"revoked {token.revoked_at:%Y-%m-%d %H:%M}" if token.revoked_at else "active"
            created = f"{token.created_at:%Y-%m-%d %H:%M}"
            print(f"{token.id:>4}  {name:<16} {token.prefix + '…':<12} {token.name[:24]:<24} {created:<20} {status}")
    return 0


def run_user_list(args: argparse.Namespace) -> int:
    db = _database()
    with db.read() as session:
        print(f"{'USER':<20} {'ADMIN':<6} {'GPU LIMIT':<10} SHARE")
        for user in session.scalars(select(User).order_by(User.name)):
            limit = str(user.gpu_limit) if user.gpu_limit is not None else "default"
            print(f"{user.name:<20} {'yes' if user.is_admin else 'no':<6} {limit:<10} {user.share:g}")
    return 0


def run_user_set(args: argparse.Namespace) -> int:
    db = _database()
    with db.write() as session:
        user = session.scalars(select(User).where(User.name == args.name)).one_or_none()
        if user is None:
            raise SystemExit(f"towerq: no user {args.name!r}")
        if args.gpu_limit is not None:
            user.gpu_limit = args.gpu_limit or None
        if args.share is not None:
            if args.share <= 0:
                raise SystemExit("towerq: --share must be positive")
            user.share = args.share
        if args.admin is not None:
            user.is_admin = args.admin
        if args.max_priority is not None:
            user.max_priority = args.max_priority
        admin = "yes" if user.is_admin else "no"
        print(
            f"{user.name}: admin={admin} gpu_limit={user.gpu_limit or 'default'} share={user.share:g} "
            f"max_priority={user.allowed_priority}"
        )
    return 0
