"""Admin commands on the service's database: the first admin (`towerq admin bootstrap`), and
`towerq token` and `towerq user` where the command line is not logged in (`towerq.cli.people`
goes through the API where it is)."""

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
from towerq.cli.people import OnDatabase, print_tokens, print_user, print_users, user_change


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


def token_create(args: argparse.Namespace) -> int:
    _check_user_name(args.user)
    db = _database()
    with db.write() as session:
        row, secret = create_token(session, args.user, admin=args.admin, label=args.name)
        role = "admin" if row.user.is_admin else "user"
        print(f"token {row.id} for {role} {args.user} (store it now: it is not shown again)")
    print(secret)
    return 0


def token_revoke(args: argparse.Namespace) -> int:
    db = _database()
    with db.write() as session:
        revoked = revoke_token(session, args.id)
        print(f"token {revoked.id} ({revoked.prefix}…) revoked")
    return 0


def token_list(args: argparse.Namespace) -> int:
    db = _database()
    with db.read() as session:
        found = session.execute(
            select(ApiToken, User.name).join(User, ApiToken.user_id == User.id).order_by(ApiToken.id)
        )
        print_tokens([(t.id, name, t.prefix, t.name, t.created_at, t.revoked_at) for t, name in found])
    return 0


def user_list(args: argparse.Namespace) -> int:
    db = _database()
    with db.read() as session:
        print_users(
            [(u.name, u.is_admin, u.gpu_limit, u.share) for u in session.scalars(select(User).order_by(User.name))]
        )
    return 0


def user_set(args: argparse.Namespace) -> int:
    if args.share is not None and args.share <= 0:
        raise SystemExit("towerq: --share must be positive")
    change = user_change(args)
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
        print_user(row.name, row.is_admin, row.gpu_limit, row.share, row.allowed_priority)
    return 0


ON_DATABASE: dict[str, OnDatabase] = {
    "token create": token_create,
    "token revoke": token_revoke,
    "token list": token_list,
    "user list": user_list,
    "user set": user_set,
}
"""`towerq token` and `towerq user` (`towerq.cli.people`) where the command line is not logged in."""
