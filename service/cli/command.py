"""The whole `towerq` command: servers (`up`, `api`, `worker`, `scheduler`, `db`), admin
(`token`, `user`), the trace simulator (`simulate`), and the member commands of `towerq.cli`
(`submit`, `jobs`, `show`, `cancel`, `logs`, `gpus`, ...), which sit on the Python client."""

from __future__ import annotations

import argparse
import logging
import sys

import redis
from sqlalchemy.exc import OperationalError

from service.cli import admin, server, simulate
from service.cli.redis_server import RedisUnavailableError
from service.core.db import SchemaError
from service.core.keyspace import KeyspaceError
from service.core.settings import Settings, redacted
from service.executors import UnknownExecutorError
from towerq.cli import commands
from towerq.cli.main import run
from towerq.cli.session import parse_command_line


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="towerq", description="Multi-GPU training service.")
    subcommands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    server.add_commands(subcommands)
    simulate.add_commands(subcommands)
    admin.add_commands(subcommands)
    commands.add_commands(subcommands, on_database=admin.ON_DATABASE)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(parser(), argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    for chatty in ("alembic", "httpx", "rq.worker"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        return run(args, args.run)
    except (RedisUnavailableError, SchemaError, KeyspaceError, UnknownExecutorError) as err:
        print(f"towerq: {err}", file=sys.stderr)
        return 1
    except OperationalError as err:  # the database refused the credentials or did not answer
        reason = str(err.orig or err).strip().splitlines()[0]
        print(f"towerq: cannot use the database at {redacted(Settings().database_url)}: {reason}", file=sys.stderr)
        return 1
    except (redis.AuthenticationError, redis.ConnectionError) as err:
        print(f"towerq: cannot use Redis at {redacted(Settings().redis_url)}: {err}", file=sys.stderr)
        return 1
